//! The accelerator layer of Tandem: device, streams, buffers and the ops the
//! accelerator runs (sampling, gather through a feature cache, training kernels),
//! with a `cuda` backend and a `host` backend.
//!
//! Not built yet: this crate is an empty member of the workspace until the
//! accelerator issue lands; nothing depends on its contents.
