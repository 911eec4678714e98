//! [`DeviceModel::new`] and [`ModelLayout`]: DGL's initialization, names, shapes
//! and layer specs for every kind and depth, spelled out here; invalid
//! configurations are errors naming the field.

use cpu_ops::{AdamConfig, Init, LayerSpec, ModelConfig, ModelKind, RELU_GAIN};

use crate::model::{DeviceModel, ModelLayout};
use crate::HostBackend;

fn cfg(kind: ModelKind, layers: usize) -> ModelConfig {
    ModelConfig {
        kind,
        in_dim: 13,
        hidden: 12,
        num_classes: 5,
        num_layers: layers,
        heads: 3,
        dropout: 0.25,
    }
}

/// A tensor's name, shape and initialization.
type Tensor = (String, Vec<usize>, Init);

/// DGL 1.1.3's layers (`GraphConv`, `SAGEConv`, `GATConv`) as `cpu_ops::Init`
/// describes them: every layer's spec and its tensors (name, shape, init), in
/// order.
fn dgl(c: &ModelConfig) -> (Vec<LayerSpec>, Vec<Tensor>) {
    let (mut specs, mut tensors) = (Vec::new(), Vec::new());
    for l in 0..c.num_layers {
        let last = l + 1 == c.num_layers;
        let d_in = if l == 0 { c.in_dim } else { c.hidden };
        let d_out = if last { c.num_classes } else { c.hidden };
        let (heads, f) = match c.kind {
            ModelKind::Gat if last => (c.heads, c.num_classes),
            ModelKind::Gat => (c.heads, c.hidden / c.heads),
            _ => (1, d_out),
        };
        specs.push(LayerSpec {
            d_in,
            d_out,
            heads,
            head_dim: f,
            last,
            first_param: tensors.len(),
        });
        let uniform = |gain| Init::XavierUniform {
            gain,
            fan_in: d_in,
            fan_out: d_out,
        };
        let normal = |fan_in, fan_out| Init::XavierNormal {
            gain: RELU_GAIN,
            fan_in,
            fan_out,
        };
        let layer: Vec<(&str, Vec<usize>, Init)> = match c.kind {
            ModelKind::Gcn => vec![
                ("weight", vec![d_in, d_out], uniform(1.0)),
                ("bias", vec![d_out], Init::Zeros),
            ],
            ModelKind::Sage => vec![
                ("weight_self", vec![d_in, d_out], uniform(RELU_GAIN)),
                ("weight_neigh", vec![d_in, d_out], uniform(RELU_GAIN)),
                ("bias", vec![d_out], Init::Zeros),
            ],
            ModelKind::Gat => vec![
                ("weight", vec![d_in, heads * f], normal(d_in, heads * f)),
                ("attn_src", vec![heads, f], normal(heads * f, f)),
                ("attn_dst", vec![heads, f], normal(heads * f, f)),
                // At the top, one bias per head (added before the heads' mean).
                (
                    "bias",
                    if last {
                        vec![heads, f]
                    } else {
                        vec![heads * f]
                    },
                    Init::Zeros,
                ),
            ],
        };
        tensors.extend(
            layer
                .into_iter()
                .map(|(name, shape, init)| (format!("layer{l}.{name}"), shape, init)),
        );
    }
    (specs, tensors)
}

#[test]
fn new_initializes_as_dgl() {
    let dev = HostBackend::new();
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        for layers in [1, 2, 3] {
            let c = cfg(kind, layers);
            let (specs, tensors) = dgl(&c);
            let names: Vec<String> = tensors.iter().map(|t| t.0.clone()).collect();
            for seed in [0, 7, 12345] {
                // Tensor i draws from stream i of the seed.
                let want: Vec<Vec<f32>> = tensors
                    .iter()
                    .enumerate()
                    .map(|(i, (_, shape, init))| init.fill(shape.iter().product(), seed, i as u64))
                    .collect();
                let dm = DeviceModel::new(&dev, &c, seed, AdamConfig::default()).expect("model");
                let what = format!("{kind:?} × {layers}, seed {seed}");
                assert_eq!(dm.param_names(), names, "{what}: names");
                assert_eq!(dm.layer_specs(), specs, "{what}: specs");
                let got = dm.params_to_host(&dev).expect("params");
                // Bit for bit (same streams, same rounding).
                let bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
                    v.iter()
                        .map(|t| t.iter().map(|x| x.to_bits()).collect())
                        .collect()
                };
                assert_eq!(bits(&got), bits(&want), "{what}: values");
                assert_eq!(dm.version(), 0);
                assert_eq!(dm.config(), &c);
                // The layout without a device says the same, with shapes that
                // hold the tensors.
                let layout = ModelLayout::new(&c).expect("layout");
                assert_eq!(layout.param_names(), names);
                assert_eq!(layout.layer_specs(), specs);
                assert_eq!(layout.init_params(seed), want);
                for (p, (name, shape, init)) in layout.params().iter().zip(&tensors) {
                    assert_eq!((&p.name, &p.shape, &p.init), (name, shape, init));
                    assert_eq!(p.len, shape.iter().product::<usize>(), "{name}");
                }
                for l in 0..layers {
                    let end = specs.get(l + 1).map_or(tensors.len(), |s| s.first_param);
                    assert_eq!(
                        layout.layer_params(l).expect("range"),
                        specs[l].first_param..end
                    );
                    assert_eq!(layout.layer(l).expect("layer").spec(), &specs[l]);
                }
                assert!(layout.layer(layers).is_none());
                assert!(layout.layer_params(layers).is_err());
            }
        }
    }
}

/// The values themselves: Xavier-uniform within its bound and filling it,
/// Xavier-normal with its standard deviation, independent streams.
#[test]
fn initial_values_follow_the_xavier_bounds() {
    let c = ModelConfig {
        in_dim: 50,
        hidden: 40,
        heads: 4,
        ..cfg(ModelKind::Sage, 2)
    };
    let sage = ModelLayout::new(&c).expect("layout").init_params(1);
    let bound = RELU_GAIN * (6.0f64 / 90.0).sqrt();
    for t in &sage[..2] {
        assert!(t.iter().all(|&v| f64::from(v).abs() <= bound));
        assert!(t.iter().any(|&v| f64::from(v).abs() > 0.9 * bound));
    }
    assert_ne!(sage[0], sage[1], "independent streams");
    let gcn = ModelLayout::new(&ModelConfig {
        kind: ModelKind::Gcn,
        ..c.clone()
    })
    .expect("layout")
    .init_params(1);
    let bound = (6.0f64 / 90.0).sqrt();
    assert!(gcn[0].iter().all(|&v| f64::from(v).abs() <= bound));
    assert!(gcn[0].iter().any(|&v| f64::from(v).abs() > 0.9 * bound));
    let gat = ModelLayout::new(&ModelConfig {
        kind: ModelKind::Gat,
        ..c
    })
    .expect("layout")
    .init_params(1);
    // fc: fans (50, 40); attention (1, 4, 10): fans (40, 10).
    for (t, std) in [
        (&gat[0], RELU_GAIN * (2.0f64 / 90.0).sqrt()),
        (&gat[1], RELU_GAIN * (2.0f64 / 50.0).sqrt()),
    ] {
        let n = t.len() as f64;
        let var = t.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n;
        assert!(
            (var.sqrt() / std - 1.0).abs() < 4.0 / n.sqrt() + 0.05,
            "std {} vs {std}",
            var.sqrt()
        );
    }
}

#[test]
fn seeds_give_different_weights_and_biases_start_at_zero() {
    let c = cfg(ModelKind::Sage, 2);
    let layout = ModelLayout::new(&c).expect("layout");
    let (a, b) = (layout.init_params(1), layout.init_params(2));
    assert_ne!(a[0], b[0]);
    for (p, t) in layout.params().iter().zip(&a) {
        if p.name.ends_with(".bias") {
            assert!(t.iter().all(|&v| v == 0.0), "{}", p.name);
        } else {
            assert!(t.iter().any(|&v| v != 0.0), "{}", p.name);
        }
    }
}

#[test]
fn invalid_configurations_are_errors_naming_the_field() {
    let dev = HostBackend::new();
    let adam = AdamConfig::default();
    let cases = [
        (
            ModelConfig {
                num_layers: 0,
                ..cfg(ModelKind::Sage, 1)
            },
            "num_layers",
        ),
        (
            ModelConfig {
                hidden: 10,
                ..cfg(ModelKind::Gat, 2)
            },
            "hidden",
        ),
        (
            ModelConfig {
                heads: 0,
                ..cfg(ModelKind::Gat, 2)
            },
            "heads",
        ),
        (
            ModelConfig {
                dropout: 1.0,
                ..cfg(ModelKind::Gcn, 2)
            },
            "dropout",
        ),
        (
            ModelConfig {
                in_dim: usize::MAX / 2,
                ..cfg(ModelKind::Gcn, 2)
            },
            "overflows",
        ),
    ];
    for (c, field) in cases {
        let e = match DeviceModel::new(&dev, &c, 0, adam) {
            Ok(_) => panic!("{c:?} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(field), "{field}: {e}");
        assert!(ModelLayout::new(&c).is_err());
    }
    // Decoupled weight decay is the host optimizer's only.
    let e = match DeviceModel::new(
        &dev,
        &cfg(ModelKind::Sage, 2),
        0,
        AdamConfig {
            decay: cpu_ops::WeightDecay::Decoupled,
            ..adam
        },
    ) {
        Ok(_) => panic!("AdamW accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("adam.decay"), "{e}");
}

#[test]
fn from_params_holds_the_given_values_and_checks_their_lengths() {
    let dev = HostBackend::new();
    let c = cfg(ModelKind::Gat, 2);
    let layout = ModelLayout::new(&c).expect("layout");
    let values: Vec<Vec<f32>> = layout
        .params()
        .iter()
        .enumerate()
        .map(|(i, p)| (0..p.len).map(|k| (i * 1000 + k) as f32).collect())
        .collect();
    let refs: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
    layout.check_params(&refs).expect("lengths");
    let dm = DeviceModel::from_params(&dev, &c, &refs, AdamConfig::default()).expect("model");
    assert_eq!(dm.params_to_host(&dev).expect("params"), values);
    let short = &refs[..refs.len() - 1];
    assert!(DeviceModel::from_params(&dev, &c, short, AdamConfig::default()).is_err());
    assert!(layout.check_params(short).is_err());
    let mut cut = refs.clone();
    cut[2] = &values[2][1..];
    let e = match DeviceModel::from_params(&dev, &c, &cut, AdamConfig::default()) {
        Ok(_) => panic!("a short tensor was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("parameter tensors"), "{e}");
}
