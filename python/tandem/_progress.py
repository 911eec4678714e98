"""The progress bar of ``Trainer(verbose=True)``: one line on ``sys.stderr``,
redrawn in place per batch, and a line per epoch (the ``tandem train`` columns).
"""

import sys
import time


class ProgressBar:
    """A callback drawing ``epoch E [=====     ] k/n batches`` and epoch lines."""

    def __init__(self, epochs, stream=None):
        self.epochs = epochs
        self.stream = stream if stream is not None else sys.stderr
        self.started = None
        self.last_draw = 0.0

    def on_batch(self, b):
        now = time.monotonic()
        if self.started is None or b.batch == 0:
            self.started = now
        done = b.batch + 1
        # At most 20 redraws a second, and always the last batch.
        if done < b.batches and now - self.last_draw < 0.05:
            return None
        self.last_draw = now
        width = 30
        fill = width * done // max(b.batches, 1)
        self.stream.write(
            f"\repoch {b.epoch:>3} [{'=' * fill}{' ' * (width - fill)}] "
            f"{done}/{b.batches} batches, loss {b.loss:.4f} ({now - self.started:.1f} s)"
        )
        self.stream.flush()
        return None

    def on_epoch(self, e):
        acc = lambda a: "  -   " if a is None else f"{a:.4f}"
        self.stream.write(
            f"\r\x1b[2Kepoch {e.epoch:>3}: loss {e.loss:.4f}, train {e.train_acc:.4f}, "
            f"val {acc(e.val_acc)}, test {acc(e.test_acc)}, "
            f"{e.train_secs:.2f} s train, {e.eval_secs:.2f} s eval\n"
        )
        self.stream.flush()
        return None
