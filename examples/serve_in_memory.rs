//! A service that keeps its graph in memory: build a dataset from arrays (an edge
//! index, a feature matrix, labels; nothing written to disk), train with the
//! library API, then answer embedding and prediction requests for vertex ids from a
//! server thread, as `ndarray` matrices.
//!
//! ```sh
//! cargo run --release -p runtime --example serve_in_memory
//! ```
//!
//! `cargo test -p runtime --example serve_in_memory` runs it as a test (a few
//! seconds). The "service" is a few threads and channels standing in for whatever
//! RPC framework hosts it.

use std::sync::mpsc;
use std::thread;

use runtime::config::{ModelSection, ThreadsSection, TrainConfig, TrainSection};
use runtime::data::{Amount, SplitSpec};
use runtime::ndarray::{Array1, Array2};
use runtime::{DatasetBuilder, Result, TrainerBuilder};

/// The service's data: a graph of `VERTICES` vertices in `CLASSES` communities.
const VERTICES: usize = 3000;
const CLASSES: usize = 4;
const DIM: usize = 16;
/// Undirected edges, each given once.
const EDGES: usize = 12_000;
/// Share of edges inside a community.
const HOMOPHILY: f64 = 0.8;

/// A tiny seeded generator (splitmix64), so the example needs nothing else.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Roughly normal: the sum of four uniforms, centered and scaled.
    fn noise(&mut self) -> f32 {
        let s: f64 = (0..4).map(|_| self.unit()).sum();
        ((s - 2.0) * 3f64.sqrt()) as f32
    }
}

/// What the service holds in memory: an edge index `(2, E)` (row 0 sources, row 1
/// targets), features `(n, d)` and labels `(n,)`, as a Python host would hand
/// over from PyTorch tensors.
fn service_data(seed: u64) -> (Array2<i64>, Array2<f32>, Array1<i64>) {
    let mut rng = Rng(seed);
    let labels: Array1<i64> = (0..VERTICES).map(|_| rng.below(CLASSES) as i64).collect();
    let mut members = vec![Vec::new(); CLASSES];
    for (v, &c) in labels.iter().enumerate() {
        members[c as usize].push(v);
    }
    let mut edge_index = Array2::<i64>::zeros((2, EDGES));
    for j in 0..EDGES {
        let s = rng.below(VERTICES);
        let d = if rng.unit() < HOMOPHILY {
            let same = &members[labels[s] as usize];
            same[rng.below(same.len())]
        } else {
            rng.below(VERTICES)
        };
        edge_index[[0, j]] = s as i64;
        edge_index[[1, j]] = d as i64;
    }
    // Features: a weak class signal under unit noise (the graph has to help).
    let centers: Vec<f32> = (0..CLASSES * DIM).map(|_| rng.noise() * 0.5).collect();
    let features = Array2::from_shape_fn((VERTICES, DIM), |(v, k)| {
        centers[labels[v] as usize * DIM + k] + rng.noise()
    });
    (edge_index, features, labels)
}

/// What a client asks for.
#[derive(Clone, Copy, Debug)]
enum Query {
    /// The output of the layer below the classifier (`ids × hidden`).
    Embeddings,
    /// Logits (`ids × classes`).
    Predict,
}

/// A request to the server: what, for which vertices, and where to answer.
struct Request {
    query: Query,
    ids: Vec<u32>,
    reply: mpsc::Sender<Result<Array2<f32>>>,
}

/// A request's answer as a client reports it: the matrix shape, or the error.
type Shape = std::result::Result<(usize, usize), String>;

/// What the clients saw.
#[derive(Debug)]
struct Report {
    /// Accuracy of the served predictions on the test vertices.
    test_acc: f64,
    /// Each request, with the shape of its answer or the error message.
    answers: Vec<(Query, Vec<u32>, Shape)>,
}

/// Builds the dataset, trains, and serves a few clients; prints progress when
/// `verbose`.
fn run(verbose: bool) -> Result<Report> {
    // 1. The dataset, from the arrays in memory: the edge index is symmetrized (each
    //    edge was given once) as `tandem import edgelist` does; the split is the
    //    importers' (50 training vertices per class, 20% validation, the rest test).
    let (edge_index, features, labels) = service_data(7);
    let ds = DatasetBuilder::new("service-graph")
        .edge_index(&edge_index)
        .symmetrize(true)
        .features(&features)
        .labels(&labels)
        .split(SplitSpec {
            train: Amount::PerClass(50),
            val: Amount::Fraction(0.2),
            test: Amount::Rest,
        })
        .seed(1)
        .build()?;
    if verbose {
        println!("[service] {}", ds.summary());
    }
    let test_ids = ds.test_ids();
    let test_labels: Vec<i64> = test_ids.iter().map(|&v| labels[v as usize]).collect();

    // 2. Training with the library API: a 2-layer GraphSAGE, a few epochs.
    let cfg = TrainConfig {
        model: ModelSection {
            hidden: 32,
            dropout: 0.2,
            ..ModelSection::default()
        },
        train: TrainSection {
            fanouts: vec![10, 10],
            batch_size: 64,
            epochs: 6,
            lr: 0.01,
            ..TrainSection::default()
        },
        threads: ThreadsSection {
            compute: 2,
            ..ThreadsSection::default()
        },
        ..TrainConfig::default()
    };
    let mut trainer = TrainerBuilder::new(cfg).dataset(ds).build()?;
    let stats = trainer.fit()?;
    if verbose {
        for s in &stats {
            println!(
                "[service] epoch {}: loss {:.4}, val acc {}",
                s.epoch,
                s.loss,
                s.val_acc.map_or_else(|| "-".into(), |a| format!("{a:.4}"))
            );
        }
    }

    // 3. Serving: the trainer moves to a server thread, which answers requests in
    //    order; embeddings and logits are computed once for these weights and then
    //    read row by row.
    let (req_tx, req_rx) = mpsc::channel::<Request>();
    let server = thread::spawn(move || {
        for r in req_rx {
            let answer = match r.query {
                Query::Embeddings => trainer.embeddings(&r.ids),
                Query::Predict => trainer.predict(&r.ids),
            };
            let _ = r.reply.send(answer);
        }
    });
    let last = VERTICES as u32 - 1;
    let requests = [
        (Query::Predict, test_ids.clone()),
        (Query::Embeddings, vec![0, 42, last]),
        (Query::Predict, vec![5]),
        (Query::Embeddings, vec![1, last + 1]), // out of range: an error
    ];
    let clients: Vec<_> = requests
        .into_iter()
        .map(|(query, ids)| {
            let tx = req_tx.clone();
            thread::spawn(move || {
                let (reply, answer) = mpsc::channel();
                let sent = tx.send(Request {
                    query,
                    ids: ids.clone(),
                    reply,
                });
                let answer = match sent {
                    Ok(()) => answer.recv().unwrap_or_else(|_| {
                        Err(runtime::Error::invalid_argument("server", "hung up"))
                    }),
                    Err(_) => Err(runtime::Error::invalid_argument("server", "gone")),
                };
                (query, ids, answer)
            })
        })
        .collect();
    drop(req_tx);

    let mut report = Report {
        test_acc: 0.0,
        answers: Vec::new(),
    };
    for c in clients {
        let (query, ids, answer) = c.join().expect("client thread");
        let shape = answer.as_ref().map(|a| a.dim()).map_err(|e| e.to_string());
        match (&answer, query) {
            (Ok(logits), Query::Predict) if ids == test_ids => {
                let correct = logits
                    .rows()
                    .into_iter()
                    .zip(&test_labels)
                    .filter(|(row, &y)| argmax(row.iter()) == y as usize)
                    .count();
                report.test_acc = correct as f64 / ids.len().max(1) as f64;
                if verbose {
                    println!(
                        "[client] predictions for the {} test vertices: {} × {} logits, accuracy {:.4}",
                        ids.len(),
                        logits.nrows(),
                        logits.ncols(),
                        report.test_acc
                    );
                }
            }
            (Ok(a), _) if verbose => println!(
                "[client] {query:?} of {ids:?}: {} × {} matrix, first row starts {:.4}",
                a.nrows(),
                a.ncols(),
                a.first().copied().unwrap_or(0.0)
            ),
            (Err(e), _) if verbose => println!("[client] {query:?} of {ids:?}: error: {e}"),
            _ => {}
        }
        report.answers.push((query, ids, shape));
    }
    server.join().expect("server thread");
    Ok(report)
}

/// The index of the largest value.
fn argmax<'a>(row: impl Iterator<Item = &'a f32>) -> usize {
    row.enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map_or(0, |(i, _)| i)
}

fn main() -> Result<()> {
    let report = run(true)?;
    println!(
        "[service] served {} requests; test accuracy of the served predictions {:.4}",
        report.answers.len(),
        report.test_acc
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_embeddings_and_predictions_of_a_graph_built_in_memory() {
        let t = std::time::Instant::now();
        let report = run(false).unwrap();
        // Chance is 1/4; the run above reaches about 0.97.
        assert!(report.test_acc > 0.85, "{report:?}");
        let shapes: Vec<_> = report.answers.iter().map(|a| a.2.clone()).collect();
        assert_eq!(shapes[1], Ok((3, 32)));
        assert_eq!(shapes[2], Ok((1, CLASSES)));
        let err = shapes[3].as_ref().unwrap_err();
        assert!(err.contains("3000 at position 1"), "{err}");
        let (rows, cols) = shapes[0].clone().unwrap();
        assert_eq!(cols, CLASSES);
        assert!(rows > VERTICES / 2);
        eprintln!("ran in {:.2?}", t.elapsed());
    }
}
