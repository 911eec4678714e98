//! Parity: memory, streams and events.

use cpu_ops::Rng;
use gpu_ops::{Backend, Elem};

use crate::helpers::*;

pub(crate) fn round_trip<B: Backend>(d: &B) {
    let mut rng = Rng::new(1);
    let f = rand_f32(&mut rng, 1001);
    let b = d.to_device(&f).unwrap();
    assert_eq!(d.len(&b), 1001);
    assert_eq!(bits(&down(d, &b, 1001)), bits(&f));
    let u: Vec<u32> = (0..77).map(|_| rng.next_u32()).collect();
    assert_eq!(down(d, &d.to_device(&u).unwrap(), 77), u);
    let w: Vec<u64> = (0..13).map(|_| rng.next_u64()).collect();
    assert_eq!(down(d, &d.to_device(&w).unwrap(), 13), w);
    let bytes: Vec<u8> = (0..31).map(|_| rng.next_u32() as u8).collect();
    assert_eq!(down(d, &d.to_device(&bytes).unwrap(), 31), bytes);

    // Fresh buffers are zeroed; upload writes a prefix; copy and fill_zero prefixes.
    let mut z = d.alloc::<f32>(10).unwrap();
    assert_eq!(down(d, &z, 10), vec![0.0; 10]);
    d.upload(d.stream(), &f[..4], &mut z).unwrap();
    assert_eq!(down(d, &z, 10)[..5], [f[0], f[1], f[2], f[3], 0.0]);
    let mut c = d.alloc::<f32>(6).unwrap();
    d.copy(&b, &mut c, 6).unwrap();
    assert_eq!(down(d, &c, 6), f[..6].to_vec());
    d.fill_zero(&mut c, 2).unwrap();
    assert_eq!(down(d, &c, 6)[..3], [0.0, 0.0, f[2]]);
    let mut part = [0.0f32; 3];
    d.download(d.stream(), &b, &mut part).unwrap();
    assert_eq!(part, [f[0], f[1], f[2]]);

    // Pinned buffers, on a second stream ordered by an event.
    let s = d.new_stream().unwrap();
    let mut p = d.alloc_pinned::<u32>(9).unwrap();
    assert_eq!(d.pinned_slice(&p), &[0; 9]);
    d.pinned_slice_mut(&mut p).copy_from_slice(&u[..9]);
    let mut dst = d.alloc::<u32>(12).unwrap();
    d.upload_pinned(&s, &p, &mut dst).unwrap();
    let e = d.record_event(&s).unwrap();
    d.wait_event(d.stream(), &e).unwrap();
    d.synchronize(&s).unwrap();
    let got = down(d, &dst, 12);
    assert_eq!(&got[..9], &u[..9]);
    assert_eq!(&got[9..], &[0, 0, 0]);
}

/// `upload_pinned_at` of `T` values: random slices of pinned staging placed at random
/// offsets of a larger buffer on a copy stream, checked element by element (the
/// untouched elements too) against a host model; `n = 0`; out-of-range errors that
/// leave the buffer unchanged.
fn upload_at_case<B: Backend, T: Elem + PartialEq>(
    d: &B,
    rng: &mut Rng,
    value: impl Fn(&mut Rng) -> T,
) {
    const LEN: usize = 1000;
    const STAGE: usize = 97;
    let mut model: Vec<T> = (0..LEN).map(|_| value(rng)).collect();
    let mut dst = d.to_device(&model).unwrap();
    let copy = d.new_stream().unwrap();
    // The copy stream starts after the compute stream's upload above.
    let uploaded = d.record_event(d.stream()).unwrap();
    d.wait_event(&copy, &uploaded).unwrap();
    let mut stage = d.alloc_pinned::<T>(STAGE).unwrap();
    for round in 0..12 {
        let rows: Vec<T> = (0..STAGE).map(|_| value(rng)).collect();
        // The mutable view waits for the previous round's copy out of `stage`.
        d.pinned_slice_mut(&mut stage).copy_from_slice(&rows);
        let n = match round {
            0 => 0,
            1 => STAGE,
            _ => rng.below(STAGE as u64 + 1) as usize,
        };
        let offset = match round {
            2 => LEN - n,
            3 => 0,
            _ => rng.below((LEN - n) as u64 + 1) as usize,
        };
        d.upload_pinned_at(&copy, &stage, n, &mut dst, offset)
            .unwrap();
        model[offset..offset + n].copy_from_slice(&rows[..n]);
    }
    // n = 0 at the very end is fine.
    d.upload_pinned_at(&copy, &stage, 0, &mut dst, LEN).unwrap();
    // Out of range: errors, nothing written.
    assert_size_mismatch(
        "n > pinned length",
        d.upload_pinned_at(&copy, &stage, STAGE + 1, &mut dst, 0),
    );
    assert_size_mismatch(
        "offset + n > length",
        d.upload_pinned_at(&copy, &stage, 2, &mut dst, LEN - 1),
    );
    assert_size_mismatch(
        "offset > length, n = 0",
        d.upload_pinned_at(&copy, &stage, 0, &mut dst, LEN + 1),
    );
    assert_size_mismatch(
        "offset + n overflows",
        d.upload_pinned_at(&copy, &stage, 1, &mut dst, usize::MAX),
    );
    let done = d.record_event(&copy).unwrap();
    d.wait_event(d.stream(), &done).unwrap();
    d.synchronize(&copy).unwrap();
    let got = down(d, &dst, LEN);
    let first_bad = got.iter().zip(&model).position(|(g, w)| g != w);
    assert_eq!(
        first_bad,
        None,
        "{}: element differs",
        std::any::type_name::<T>()
    );
}

pub(crate) fn upload_pinned_at_offsets<B: Backend>(d: &B) {
    let mut rng = Rng::new(2);
    // Element sizes 4, 8 and 1: the byte offset is `offset · size_of::<T>()`.
    upload_at_case::<B, f32>(d, &mut rng, |r| r.next_f32());
    upload_at_case::<B, u64>(d, &mut rng, |r| r.next_u64());
    upload_at_case::<B, u8>(d, &mut rng, |r| r.next_u32() as u8);
    // A small case by hand, on the compute stream.
    let mut dst = d.to_device(&[1u32, 2, 3, 4, 5, 6]).unwrap();
    let mut p = d.alloc_pinned::<u32>(3).unwrap();
    d.pinned_slice_mut(&mut p).copy_from_slice(&[7, 8, 9]);
    d.upload_pinned_at(d.stream(), &p, 2, &mut dst, 3).unwrap();
    assert!(d.upload_pinned_at(d.stream(), &p, 2, &mut dst, 5).is_err());
    assert_eq!(down(d, &dst, 6), [1, 2, 3, 7, 8, 6]);
}

pub(crate) fn events_time_forward<B: Backend>(d: &B) {
    let a = d.record_event(d.stream()).unwrap();
    let mut x = d.alloc::<f32>(1 << 16).unwrap();
    d.relu(&mut x, 1 << 16).unwrap();
    let b = d.record_event(d.stream()).unwrap();
    d.synchronize(d.stream()).unwrap();
    let ms = d.elapsed_ms(&a, &b).unwrap();
    assert!(ms >= 0.0 && ms.is_finite(), "{ms}");
    assert_eq!(d.elapsed_ms(&a, &a).unwrap(), 0.0);
    let m = d.memory_info().unwrap();
    assert!(m.total > 0 && m.free <= m.total, "{m:?}");
    assert!(!d.describe().is_empty());
}

/// `download_pinned`: asynchronous (a download, no synchronization, until the
/// host waits for an event recorded after it: one event wait), ordered on its
/// stream (an overwrite issued after it does not change what it read), a prefix
/// only, reusable, on a copy stream too; `n = 0` and out-of-range errors.
pub(crate) fn download_pinned_orders_on_its_stream<B: Backend>(d: &B) {
    let mut rng = Rng::new(3);
    let f = rand_f32(&mut rng, 513);
    let mut src = d.to_device(&f).unwrap();
    let mut p = d.alloc_pinned::<f32>(600).unwrap();
    d.synchronize(d.stream()).unwrap();
    let before = d.transfer_stats();
    d.download_pinned(d.stream(), &src, 513, &mut p).unwrap();
    let copied = d.record_event(d.stream()).unwrap();
    // Overwritten after the copy, on its stream: the copy read the old values.
    d.fill_zero(&mut src, 513).unwrap();
    let issued = d.transfer_stats().since(&before);
    assert_eq!(
        (issued.downloads, issued.download_bytes, issued.syncs),
        (1, 513 * 4, 0),
        "{issued:?}"
    );
    assert_eq!(issued.event_waits, 0, "{issued:?}");
    d.wait_host(&copied).unwrap();
    let waited = d.transfer_stats().since(&before);
    assert_eq!((waited.syncs, waited.event_waits), (0, 1), "{waited:?}");
    assert_eq!(bits(&d.pinned_slice(&p)[..513]), bits(&f));
    assert_eq!(&d.pinned_slice(&p)[513..], &[0.0; 87], "past n: untouched");

    // Again into the same buffer, a shorter prefix (now zeros).
    d.download_pinned(d.stream(), &src, 100, &mut p).unwrap();
    let e = d.record_event(d.stream()).unwrap();
    d.wait_host(&e).unwrap();
    assert_eq!(&d.pinned_slice(&p)[..100], &[0.0; 100]);
    assert_eq!(bits(&d.pinned_slice(&p)[100..513]), bits(&f[100..]));

    // On a copy stream ordered after the compute stream's upload.
    let u: Vec<u32> = (0..77).map(|_| rng.next_u32()).collect();
    let ub = d.to_device(&u).unwrap();
    let copy = d.new_stream().unwrap();
    let up = d.record_event(d.stream()).unwrap();
    d.wait_event(&copy, &up).unwrap();
    let mut q = d.alloc_pinned::<u32>(77).unwrap();
    d.download_pinned(&copy, &ub, 77, &mut q).unwrap();
    let e = d.record_event(&copy).unwrap();
    d.wait_host(&e).unwrap();
    assert_eq!(d.pinned_slice(&q), &u[..]);
    // The mutable view waits for the copy too; writing it leaves the device alone.
    d.pinned_slice_mut(&mut q).fill(0);
    assert_eq!(down(d, &ub, 77), u);

    // n = 0 copies nothing; out of range is an error.
    d.download_pinned(d.stream(), &src, 0, &mut p).unwrap();
    assert_size_mismatch(
        "n > source length",
        d.download_pinned(d.stream(), &src, 514, &mut p),
    );
    let long = d.alloc::<f32>(700).unwrap();
    assert_size_mismatch(
        "n > pinned length",
        d.download_pinned(d.stream(), &long, 601, &mut p),
    );
    d.synchronize(d.stream()).unwrap();
}
