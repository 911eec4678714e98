//! [`DeviceModel::new`] and [`ModelLayout`]: the host model's initialization,
//! names, shapes and layer specs for every kind and depth; invalid
//! configurations are errors naming the field.

use cpu_ops::{AdamConfig, Model, ModelConfig, ModelKind};

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

#[test]
fn new_initializes_exactly_as_the_host_model() {
    let dev = HostBackend::new();
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        for layers in [1, 2, 3] {
            let c = cfg(kind, layers);
            for seed in [0, 7, 12345] {
                let host = Model::<f32>::new(&c, seed).expect("host model");
                let dm = DeviceModel::new(&dev, &c, seed, AdamConfig::default()).expect("model");
                let what = format!("{kind:?} × {layers}, seed {seed}");
                assert_eq!(dm.param_names(), host.param_names(), "{what}: names");
                assert_eq!(dm.layer_specs(), host.layer_specs(), "{what}: specs");
                let got = dm.params_to_host(&dev).expect("params");
                let want: Vec<Vec<f32>> = host.params().iter().map(|p| p.to_vec()).collect();
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
                assert_eq!(layout.param_names(), host.param_names());
                assert_eq!(layout.layer_specs(), host.layer_specs());
                assert_eq!(layout.init_params(seed), want);
                for (p, t) in layout.params().iter().zip(&want) {
                    assert_eq!(p.shape.iter().product::<usize>(), t.len(), "{}", p.name);
                    assert_eq!(p.len, t.len(), "{}", p.name);
                }
                for l in 0..layers {
                    assert_eq!(
                        layout.layer_params(l).expect("range"),
                        host.layer_params(l)
                            .map(|t| {
                                let first = host.layer_specs()[l].first_param;
                                first..first + t.len()
                            })
                            .expect("host range")
                    );
                    assert_eq!(
                        layout.layer(l).expect("layer").spec(),
                        &host.layer_specs()[l]
                    );
                }
                assert!(layout.layer(layers).is_none());
                assert!(layout.layer_params(layers).is_err());
            }
        }
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
