//! Parity: memory, streams and events.

use cpu_ops::Rng;
use gpu_ops::Backend;

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
