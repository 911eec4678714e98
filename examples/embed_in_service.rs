//! Tandem embedded in a service: build a trainer from a TOML string, train with a
//! progress callback and a cancel token, checkpoint, resume, and serve vertex
//! embeddings to concurrent clients.
//!
//! ```sh
//! cargo run --release -p runtime --example embed_in_service
//! ```
//!
//! The "service" here is a few threads and channels standing in for whatever RPC
//! framework hosts it; the library itself prints nothing and keeps no global state.

use std::sync::mpsc;
use std::thread;

use runtime::ndarray::Array2;
use runtime::{
    on_batch, BatchMetrics, CancelToken, Control, Embeddings, Error, Result, StopCause,
    TrainerBuilder,
};

/// The job a client submitted: a small synthetic graph and a 2-layer GraphSAGE.
const JOB: &str = r#"
[data.synthetic]
vertices = 5000
edges = 40000
classes = 8
dim = 32
homophily = 0.8
signal = 0.3

[model]
kind = "sage"
layers = 2
hidden = 64

[train]
fanouts = [10, 10]
batch_size = 256
epochs = 4
lr = 0.01

[threads]
compute = 2
"#;

/// A request to the embedding server: vertex ids and where to send the answer.
struct Request {
    ids: Vec<u32>,
    reply: mpsc::Sender<Result<Array2<f32>>>,
}

/// Answers requests from an immutable snapshot until every client hangs up.
fn serve(table: Embeddings, requests: mpsc::Receiver<Request>) {
    for r in requests {
        let _ = r.reply.send(table.gather(&r.ids));
    }
}

fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("tandem-service-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let checkpoint = dir.join("job.tck");

    // 1. Training, with progress reported to a status thread and a cancel token
    //    held by the "client", who cancels the job part-way through epoch 1.
    let (progress_tx, progress_rx) = mpsc::channel::<BatchMetrics>();
    let cancel = CancelToken::new();
    let client_cancel = cancel.clone();
    let status = thread::spawn(move || {
        let mut last_epoch = usize::MAX;
        for m in progress_rx {
            if m.batch + 1 == m.batches && m.epoch != last_epoch {
                last_epoch = m.epoch;
                println!(
                    "[status] epoch {} done: last batch loss {:.4}, weight version {}",
                    m.epoch, m.loss, m.step
                );
            }
            if m.epoch == 1 && m.batch == 5 {
                println!(
                    "[client] cancelling the job after batch {} of epoch 1",
                    m.batch
                );
                client_cancel.cancel();
            }
        }
    });
    let mut trainer = TrainerBuilder::from_toml(JOB)?
        .callback(on_batch(move |m: &BatchMetrics| {
            let _ = progress_tx.send(m.clone());
            Control::Continue
        }))
        .cancel_token(cancel)
        .build()?;
    match trainer.fit() {
        Err(Error::Cancelled {
            epoch,
            batch,
            cause: StopCause::Token,
        }) => println!("[service] job cancelled before batch {batch} of epoch {epoch}"),
        Err(e) => return Err(e),
        Ok(_) => println!("[service] the job finished before the client cancelled"),
    }
    // The position (epoch and batch) is part of the checkpoint.
    trainer.save_checkpoint(&checkpoint)?;

    // 2. Later (in a fresh process, say) the job is resumed from its checkpoint and
    //    finishes exactly as if it had never stopped.
    // The status thread's loop ends when the channel's last sender is dropped,
    // and the progress callback owns it: remove the callbacks (or drop the
    // trainer), or the thread waits for as long as the trainer lives.
    trainer.clear_callbacks();
    status.join().expect("status thread");
    drop(trainer);
    let mut resumed = TrainerBuilder::from_toml(JOB)?.build()?;
    resumed.load_checkpoint(&checkpoint)?;
    println!(
        "[service] resumed at epoch {}, batch {} ({} optimizer steps)",
        resumed.epoch(),
        resumed.batch_in_epoch(),
        resumed.steps()
    );
    let stats = resumed.fit()?;
    for s in &stats {
        println!(
            "[service] epoch {}: loss {:.4}, val acc {}",
            s.epoch,
            s.loss,
            s.val_acc.map_or_else(|| "-".into(), |a| format!("{a:.4}"))
        );
    }
    resumed.save_checkpoint(&checkpoint)?;

    // 3. Serve embeddings: one snapshot of the final weights, shared by a server
    //    thread; clients send ids and get an `ids.len() × dim` matrix back.
    let table = resumed.embedding_table()?;
    println!(
        "[service] serving {}-dim embeddings of {} vertices (weight version {})",
        table.dim(),
        table.num_vertices(),
        table.steps()
    );
    let (req_tx, req_rx) = mpsc::channel::<Request>();
    let server = thread::spawn(move || serve(table, req_rx));
    let clients: Vec<_> = [vec![0, 42, 4999], vec![7], vec![1, 5000]]
        .into_iter()
        .map(|ids| {
            let tx = req_tx.clone();
            thread::spawn(move || {
                let (reply, answer) = mpsc::channel();
                let _ = tx.send(Request {
                    ids: ids.clone(),
                    reply,
                });
                (ids, answer.recv().expect("server answers"))
            })
        })
        .collect();
    drop(req_tx);
    for c in clients {
        let (ids, answer) = c.join().expect("client thread");
        match answer {
            Ok(v) => println!(
                "[client] ids {ids:?}: {} × {} embeddings, first {:.4}",
                v.nrows(),
                v.ncols(),
                v.first().copied().unwrap_or(0.0)
            ),
            Err(e) => println!("[client] ids {ids:?}: error: {e}"),
        }
    }
    server.join().expect("server thread");
    std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(())
}
