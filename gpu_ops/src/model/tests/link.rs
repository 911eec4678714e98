//! The link head ([`Head::Link`], [`Target::Pairs`]): finite differences of
//! the binary cross-entropy of decoded pairs against the analytic gradients
//! of every tensor (encoder and decoder), both decoders, SAGE, GCN and GAT;
//! the decoder's tensors (names, shapes, initialization) and their place in
//! the model; link steps (synchronous, split, deferred) agreeing and
//! learning; node labels training bit for bit as the ops composed by hand
//! (the node task before targets); mismatched targets; and the decoder's
//! export graph evaluated against [`DeviceModel::score_pairs`].

use std::collections::HashMap;

use cpu_ops::{AdamConfig, Init, ModelConfig, ModelKind, Rng, RELU_GAIN};

use super::gradcheck::{check_tensors, config};
use super::{random_blocks, random_graph, random_params, TestBlock};
use crate::model::emit::{GraphEmitter, Reduce, Reduction, Unary};
use crate::model::{Decoder, DeviceModel, Head, ModelLayout, PairBatch, Target};
use crate::prelude::*;
use crate::{HostBackend, HostBuf, LossSlot};

const DECODERS: [Decoder; 2] = [Decoder::Dot, Decoder::Mlp];

/// `n` random pairs of `rows` rows (a row with itself among them) and labels,
/// half positive.
fn random_pairs(rng: &mut Rng, rows: usize, n: usize) -> (Vec<u32>, Vec<u32>, Vec<f32>) {
    let mut src: Vec<u32> = (0..n).map(|_| rng.below(rows as u64) as u32).collect();
    let dst: Vec<u32> = (0..n).map(|_| rng.below(rows as u64) as u32).collect();
    src[0] = dst[0];
    let labels = (0..n).map(|i| (i % 2) as f32).collect();
    (src, dst, labels)
}

/// The pairs on the host backend.
struct Pairs {
    src: HostBuf<u32>,
    dst: HostBuf<u32>,
    labels: HostBuf<f32>,
    n: usize,
}

impl Pairs {
    fn new(dev: &HostBackend, (src, dst, labels): (Vec<u32>, Vec<u32>, Vec<f32>)) -> Self {
        Self {
            n: src.len(),
            src: dev.to_device(&src).expect("src"),
            dst: dev.to_device(&dst).expect("dst"),
            labels: dev.to_device(&labels).expect("labels"),
        }
    }

    fn batch(&self) -> PairBatch<'_, HostBackend> {
        PairBatch {
            src: &self.src,
            dst: &self.dst,
            labels: &self.labels,
            n: self.n,
        }
    }
}

/// Mean binary cross-entropy of `scores` in `f64`, and `Σ |s| / n` (the scale
/// of the fp32 scores' rounding, seen through `∂ℓ/∂s ≤ 1/n`).
fn bce(scores: &[f32], labels: &[f32]) -> (f64, f64) {
    let n = scores.len() as f64;
    scores
        .iter()
        .zip(labels)
        .fold((0.0, 0.0), |(l, m), (&s, &y)| {
            let (s, y) = (f64::from(s), f64::from(y));
            let term = s.max(0.0) - s * y + (-s.abs()).exp().ln_1p();
            (l + term / n, m + s.abs() / n)
        })
}

/// One link model's tensors' gradients against finite differences of the
/// pairs' loss.
fn check_link(cfg: &ModelConfig, decoder: Decoder, sizes: &[usize], seed: u64) {
    let dev = HostBackend::new();
    let mut rng = Rng::new(seed);
    let head = Head::Link(decoder);
    let layout = ModelLayout::with_head(cfg, head).expect("layout");
    let mut params = random_params(&mut rng, &layout, 1.0);
    let tb: Vec<TestBlock> = random_blocks(&mut rng, sizes, 4);
    let blocks: Vec<_> = tb.iter().map(|b| b.on(&dev)).collect();
    let x: Vec<f32> = (0..sizes[0] * cfg.in_dim)
        .map(|_| rng.normal() as f32)
        .collect();
    let xd = dev.to_device(&x).expect("x");
    let rows = sizes[sizes.len() - 1];
    let pairs = Pairs::new(&dev, random_pairs(&mut rng, rows, 2 * rows + 1));
    let labels = pairs.labels.to_vec();
    let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
    let adam = AdamConfig::default();
    let mut dm = DeviceModel::from_params_with_head(&dev, cfg, head, &refs, adam).expect("model");
    let pb = pairs.batch();
    dm.forward_backward(&dev, &blocks, &xd, Target::Pairs(&pb), 5)
        .expect("forward and backward");
    let grads = dm.grads_to_host(&dev).expect("grads");
    let names = dm.param_names().to_vec();
    assert_eq!(names.len(), layout.params().len());
    for t in layout.head_params() {
        assert!(
            grads[t].iter().any(|v| v.abs() > 1e-4),
            "{}: no gradient",
            names[t]
        );
    }
    let what = format!("{cfg:?} {decoder:?} sizes {sizes:?}");
    check_tensors(
        &what,
        &mut rng,
        &mut params,
        &grads,
        &names,
        &mut |params| {
            let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
            dm.load(&dev, &refs, None).expect("load");
            let f = dm.forward(&dev, &blocks, &xd, true, 5).expect("forward");
            let d = cfg.num_classes;
            let s = dm
                .score_pairs(&dev, f.logits(), d, &pairs.src, &pairs.dst, pairs.n)
                .expect("scores");
            bce(&dev.to_host(&s, pairs.n).expect("scores"), &labels)
        },
    );
}

#[test]
fn link_gradients_match_finite_differences() {
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        for decoder in DECODERS {
            check_link(&config(kind, (5, 6, 4), 1, 2), decoder, &[13, 7], 1);
            check_link(&config(kind, (5, 6, 4), 2, 2), decoder, &[19, 9, 6], 2);
            check_link(&config(kind, (3, 4, 6), 2, 2), decoder, &[17, 11, 5], 3);
        }
    }
}

/// The MLP decoder's four tensors follow the encoder's, named and initialized
/// as DGL's encoders' linear layers are; the encoder is the same as under the
/// other heads (its tensors draw from the same streams); the dot decoder adds
/// nothing.
#[test]
fn the_decoder_tensors_follow_the_encoder() {
    let cfg = config(ModelKind::Sage, (5, 8, 6), 2, 1);
    let node = ModelLayout::new(&cfg).expect("layout");
    let dot = ModelLayout::with_head(&cfg, Head::Link(Decoder::Dot)).expect("layout");
    let mlp = ModelLayout::with_head(&cfg, Head::Link(Decoder::Mlp)).expect("layout");
    assert_eq!(dot.param_names(), node.param_names());
    assert!(dot.head_params().is_empty() && node.head_params().is_empty());
    let n = node.params().len();
    assert_eq!(mlp.head_params(), n..n + 4);
    let tail: Vec<_> = mlp.params()[n..]
        .iter()
        .map(|p| (p.name.as_str(), p.shape.clone(), p.init))
        .collect();
    let xavier = |gain, fan_out| Init::XavierUniform {
        gain,
        fan_in: 6,
        fan_out,
    };
    assert_eq!(
        tail,
        vec![
            ("decoder.0.weight", vec![6, 6], xavier(RELU_GAIN, 6)),
            ("decoder.0.bias", vec![6], Init::Zeros),
            ("decoder.1.weight", vec![6, 1], xavier(1.0, 1)),
            ("decoder.1.bias", vec![1], Init::Zeros),
        ]
    );
    // The top layer's tensors stop before the decoder's.
    assert_eq!(
        mlp.layer_params(1).expect("top"),
        node.layer_params(1).expect("top")
    );
    let dev = HostBackend::new();
    let adam = AdamConfig::default();
    let a = DeviceModel::new(&dev, &cfg, 7, adam).expect("node");
    let b = DeviceModel::with_head(&dev, &cfg, Head::Link(Decoder::Mlp), 7, adam).expect("link");
    assert_eq!(b.head(), Head::Link(Decoder::Mlp));
    let (pa, pb) = (
        a.params_to_host(&dev).expect("params"),
        b.params_to_host(&dev).expect("params"),
    );
    assert_eq!(pa[..], pb[..n], "the encoder starts the same");
    assert_eq!(pb.len(), n + 4);
    assert_eq!(pb, mlp.init_params(7));
    assert_eq!(b.param_names(), &mlp.param_names()[..]);
    assert_eq!(
        b.num_values(),
        a.num_values() + 6 * 6 + 6 + 6 + 1,
        "gradient sums cover the decoder"
    );
}

/// A small link task on a sampled batch: positives are edges among the seeds,
/// negatives random pairs.
struct LinkTask {
    blocks: Vec<crate::HostBlock>,
    x: HostBuf<f32>,
    pairs: Pairs,
}

fn link_task(dev: &HostBackend, in_dim: usize) -> LinkTask {
    let g = random_graph(120, 700, 5);
    let seeds: Vec<u32> = (0..40).collect();
    let graph = dev.load_graph(&g, Default::default()).expect("graph");
    let batch = dev.sample(&graph, &seeds, &[5, 5], 3).expect("sample");
    let n_in = dev.block_shape(&batch.blocks[0]).0;
    let mut rng = Rng::new(4);
    let x: Vec<f32> = (0..n_in * in_dim).map(|_| rng.normal() as f32).collect();
    let (mut src, mut dst, mut labels) = (Vec::new(), Vec::new(), Vec::new());
    for u in 0..40u32 {
        for &v in g.neighbors(u).iter().filter(|&&v| v < 40) {
            src.push(u);
            dst.push(v);
            labels.push(1.0);
            src.push(u);
            dst.push(rng.below(40) as u32);
            labels.push(0.0);
        }
    }
    LinkTask {
        blocks: batch.blocks,
        x: dev.to_device(&x).expect("x"),
        pairs: Pairs::new(dev, (src, dst, labels)),
    }
}

/// Link steps: `train_step` equals `forward_backward` then `step`, and the
/// deferred step (no synchronization) trains bit for bit the same with the
/// loss sum in its slot; 60 steps lower the loss, for both decoders.
#[test]
fn link_steps_agree_and_learn() {
    let dev = HostBackend::new();
    let task = link_task(&dev, 6);
    let pb = task.pairs.batch();
    let target = Target::Pairs(&pb);
    let adam = AdamConfig {
        lr: 0.01,
        ..AdamConfig::default()
    };
    for kind in [ModelKind::Sage, ModelKind::Gcn] {
        for decoder in DECODERS {
            let cfg = config(kind, (6, 16, 8), 2, 1);
            let head = Head::Link(decoder);
            let new = || DeviceModel::with_head(&dev, &cfg, head, 3, adam).expect("model");
            let (mut sync, mut split, mut lag) = (new(), new(), new());
            let mut slots = dev.alloc::<u64>(2 * 60).expect("slots");
            let before = dev.transfer_stats();
            for k in 0..60u64 {
                let dest = LossSlot {
                    out: &mut slots,
                    slot: k as usize,
                };
                lag.train_step_deferred(&dev, &task.blocks, &task.x, target, k, dest)
                    .expect("deferred step");
            }
            let syncs = dev.transfer_stats().since(&before).syncs;
            assert_eq!(
                syncs, 0,
                "{kind:?} {decoder:?}: a deferred step synchronized"
            );
            let words = dev.to_host(&slots, 120).expect("slots");
            let mut losses = Vec::new();
            for k in 0..60u64 {
                let s = sync
                    .train_step(&dev, &task.blocks, &task.x, target, k)
                    .expect("step");
                let f = split
                    .forward_backward(&dev, &task.blocks, &task.x, target, k)
                    .expect("forward and backward");
                split.step(&dev).expect("step");
                assert_eq!(s, f);
                let n = task.pairs.n as f64;
                assert_eq!(f64::from_bits(words[2 * k as usize]), s.loss * n);
                assert_eq!(words[2 * k as usize + 1], s.correct as u64);
                losses.push(s.loss);
            }
            let p = sync.params_to_host(&dev).expect("params");
            assert_eq!(p, split.params_to_host(&dev).expect("params"));
            assert_eq!(p, lag.params_to_host(&dev).expect("params"));
            let (first, last) = (losses[0], losses[59]);
            assert!(
                last < first * 0.8,
                "{kind:?} {decoder:?}: loss {first} -> {last}"
            );
        }
    }
}

/// `Target::Labels` is the node task as it was before targets existed: the
/// forward, the softmax cross-entropy, the backward and the Adam step composed
/// by hand give the same losses and weights, bit for bit, over three steps.
#[test]
fn labels_train_bit_for_bit_as_the_ops_composed() {
    let g = random_graph(150, 900, 6);
    let dev = HostBackend::new();
    let seeds: Vec<u32> = (0..30).collect();
    let graph = dev.load_graph(&g, Default::default()).expect("graph");
    let batch = dev.sample(&graph, &seeds, &[4, 4], 1).expect("sample");
    let n_in = dev.block_shape(&batch.blocks[0]).0;
    let mut rng = Rng::new(1);
    let x: Vec<f32> = (0..n_in * 5).map(|_| rng.normal() as f32).collect();
    let xd = dev.to_device(&x).expect("x");
    let labels: Vec<u32> = seeds.iter().map(|&s| s % 3).collect();
    let ld = dev.to_device(&labels).expect("labels");
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        let mut cfg = config(kind, (5, 8, 3), 2, 2);
        cfg.dropout = 0.25;
        let adam = AdamConfig::default();
        let mut a = DeviceModel::new(&dev, &cfg, 2, adam).expect("model");
        let mut b = DeviceModel::with_head(&dev, &cfg, Head::Classify, 2, adam).expect("model");
        for k in 0..3u64 {
            let s = a
                .train_step(&dev, &batch.blocks, &xd, Target::Labels(&ld), k)
                .expect("step");
            let f = b
                .forward(&dev, &batch.blocks, &xd, true, k)
                .expect("forward");
            let mut dl = dev.alloc_uninit(30 * 3).expect("grad");
            let t = dev
                .softmax_cross_entropy(f.logits(), 30, 3, &ld, Some(&mut dl))
                .expect("loss");
            b.backward(&dev, &batch.blocks, &xd, &f, &dl)
                .expect("backward");
            b.step(&dev).expect("step");
            assert_eq!(s.loss.to_bits(), t.loss.to_bits(), "{kind:?} step {k}");
            assert_eq!(s.correct, t.correct);
        }
        assert_eq!(
            a.params_to_host(&dev).expect("params"),
            b.params_to_host(&dev).expect("params"),
            "{kind:?}"
        );
        assert_eq!(
            a.moments_to_host(&dev).expect("moments"),
            b.moments_to_host(&dev).expect("moments")
        );
    }
}

#[test]
fn targets_must_fit_the_head() {
    let dev = HostBackend::new();
    let task = link_task(&dev, 6);
    let pb = task.pairs.batch();
    let cfg = config(ModelKind::Sage, (6, 8, 4), 2, 1);
    let adam = AdamConfig::default();
    let labels = dev.to_device(&[0u32; 40]).expect("labels");
    let mut node = DeviceModel::new(&dev, &cfg, 1, adam).expect("model");
    let err = node
        .train_step(&dev, &task.blocks, &task.x, Target::Pairs(&pb), 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Classify") && err.contains("pairs"), "{err}");
    let f = node
        .forward(&dev, &task.blocks, &task.x, false, 0)
        .expect("forward");
    let err = node
        .score_pairs(&dev, f.logits(), 4, pb.src, pb.dst, 3)
        .unwrap_err()
        .to_string();
    assert!(err.contains("pairs"), "{err}");
    let mut link =
        DeviceModel::with_head(&dev, &cfg, Head::Link(Decoder::Dot), 1, adam).expect("model");
    let err = link
        .forward_backward(&dev, &task.blocks, &task.x, Target::Labels(&labels), 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("node labels"), "{err}");
    assert_eq!(link.version(), 0);
    let f = link
        .forward(&dev, &task.blocks, &task.x, false, 0)
        .expect("forward");
    assert!(link
        .score_pairs(&dev, f.logits(), 5, pb.src, pb.dst, 3)
        .is_err());
    // A pair id past the seeds is the op's error.
    let far = dev.to_device(&[40u32]).expect("ids");
    assert!(link
        .score_pairs(&dev, f.logits(), 4, &far, pb.dst, 1)
        .is_err());
    let s = link
        .score_pairs(&dev, f.logits(), 4, pb.src, pb.dst, 3)
        .expect("scores");
    assert_eq!(s.len(), 3);
}

/// Evaluates the ops a decoder emits on host tensors (only those ops: the
/// others are not part of a decoder's graph and panic here).
#[derive(Default)]
struct Eval {
    /// Name → (shape, values).
    vals: HashMap<String, (Vec<usize>, Vec<f64>)>,
    next: usize,
}

impl Eval {
    fn put(&mut self, shape: Vec<usize>, v: Vec<f64>) -> String {
        self.next += 1;
        let name = format!("v{}", self.next);
        self.vals.insert(name.clone(), (shape, v));
        name
    }

    fn get(&self, name: &str) -> (Vec<usize>, Vec<f64>) {
        self.vals[name].clone()
    }

    fn zip(&mut self, a: &str, b: &str, f: fn(f64, f64) -> f64) -> String {
        let ((sa, va), (_, vb)) = (self.get(a), self.get(b));
        // Equal shapes, or `b` a row broadcast over `a`'s rows.
        let v = va
            .iter()
            .enumerate()
            .map(|(i, &x)| f(x, vb[i % vb.len()]))
            .collect();
        self.put(sa, v)
    }
}

impl GraphEmitter for Eval {
    fn matmul(&mut self, a: &str, b: &str) -> String {
        let ((sa, va), (sb, vb)) = (self.get(a), self.get(b));
        let (m, k, n) = (sa[0], sa[1], sb[1]);
        let v = (0..m * n)
            .map(|i| (0..k).map(|t| va[i / n * k + t] * vb[t * n + i % n]).sum())
            .collect();
        self.put(vec![m, n], v)
    }
    fn add(&mut self, a: &str, b: &str) -> String {
        self.zip(a, b, |x, y| x + y)
    }
    fn sub(&mut self, _: &str, _: &str) -> String {
        unreachable!("not a decoder op")
    }
    fn mul(&mut self, a: &str, b: &str) -> String {
        self.zip(a, b, |x, y| x * y)
    }
    fn div(&mut self, _: &str, _: &str) -> String {
        unreachable!("not a decoder op")
    }
    fn gather_rows(&mut self, data: &str, idx: &str) -> String {
        let ((s, v), (_, ix)) = (self.get(data), self.get(idx));
        let w = s[1];
        let out = ix
            .iter()
            .flat_map(|&r| v[r as usize * w..(r as usize + 1) * w].to_vec())
            .collect();
        self.put(vec![ix.len(), w], out)
    }
    fn scatter_rows(&mut self, _: &str, _: &str, _: &str, _: Reduction) -> String {
        unreachable!("not a decoder op")
    }
    fn unsqueeze(&mut self, _: &str, _: i64) -> String {
        unreachable!("not a decoder op")
    }
    fn reshape(&mut self, x: &str, shape: &[i64]) -> String {
        assert_eq!(shape, &[-1]);
        let (_, v) = self.get(x);
        self.put(vec![v.len()], v)
    }
    fn rows_of(&mut self, _: &str) -> String {
        unreachable!("not a decoder op")
    }
    fn shape_of(&mut self, _: &str) -> String {
        unreachable!("not a decoder op")
    }
    fn filled(&mut self, _: &str, _: &[i64], _: f32) -> String {
        unreachable!("not a decoder op")
    }
    fn first_rows(&mut self, _: &str, _: &str) -> String {
        unreachable!("not a decoder op")
    }
    fn arange(&mut self, _: &str) -> String {
        unreachable!("not a decoder op")
    }
    fn concat0(&mut self, _: &str, _: &str) -> String {
        unreachable!("not a decoder op")
    }
    fn unary(&mut self, op: Unary, x: &str) -> String {
        assert_eq!(op, Unary::Relu);
        let (s, v) = self.get(x);
        self.put(s, v.iter().map(|&x| x.max(0.0)).collect())
    }
    fn elu(&mut self, _: &str, _: f32) -> String {
        unreachable!("not a decoder op")
    }
    fn leaky_relu(&mut self, _: &str, _: f32) -> String {
        unreachable!("not a decoder op")
    }
    fn max_scalar(&mut self, _: &str, _: f32) -> String {
        unreachable!("not a decoder op")
    }
    fn reduce(&mut self, op: Reduce, x: &str, axis: i64) -> String {
        assert_eq!((op, axis), (Reduce::Sum, 1));
        let (s, v) = self.get(x);
        self.put(vec![s[0]], v.chunks(s[1]).map(|r| r.iter().sum()).collect())
    }
}

/// [`Decoder::emit`] computes [`DeviceModel::score_pairs`]' scores.
#[test]
fn the_emitted_decoder_scores_as_the_model_does() {
    let dev = HostBackend::new();
    let mut rng = Rng::new(12);
    let cfg = config(ModelKind::Gcn, (4, 6, 5), 1, 1);
    for decoder in DECODERS {
        let head = Head::Link(decoder);
        let layout = ModelLayout::with_head(&cfg, head).expect("layout");
        let params = random_params(&mut rng, &layout, 1.0);
        let refs: Vec<&[f32]> = params.iter().map(Vec::as_slice).collect();
        let dm = DeviceModel::from_params_with_head(&dev, &cfg, head, &refs, AdamConfig::default())
            .expect("model");
        let h: Vec<f32> = (0..9 * 5).map(|_| rng.normal() as f32).collect();
        let (src, dst, _) = random_pairs(&mut rng, 9, 11);
        let hd = dev.to_device(&h).expect("h");
        let (sd, dd) = (dev.to_device(&src).unwrap(), dev.to_device(&dst).unwrap());
        let want = dm.score_pairs(&dev, &hd, 5, &sd, &dd, 11).expect("scores");
        let mut g = Eval::default();
        let f64s = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let ids = |v: &[u32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
        let names: Vec<String> = layout
            .head_params()
            .map(|i| g.put(layout.params()[i].shape.clone(), f64s(&params[i])))
            .collect();
        let hn = g.put(vec![9, 5], f64s(&h));
        let (sn, dn) = (g.put(vec![11], ids(&src)), g.put(vec![11], ids(&dst)));
        let out = decoder.emit(&mut g, &names, &hn, &sn, &dn);
        let (shape, got) = g.get(&out);
        assert_eq!(shape, vec![11], "{decoder:?}");
        for (k, (&a, &b)) in got.iter().zip(want.iter()).enumerate() {
            assert!(
                (a - f64::from(b)).abs() < 1e-5 * (1.0 + a.abs()),
                "{decoder:?}[{k}]: {a} vs {b}"
            );
        }
    }
}
