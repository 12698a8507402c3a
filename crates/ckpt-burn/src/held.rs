//! A model's tensors as a save holds them: handle clones in slots, staged to host memory (on
//! a device backend through one batched read enqueued at the capture), and written one at a
//! time, each released once written.

use std::io::Write;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::{Bool, ExecutionError, Int, Tensor, Transaction};

use crate::encode::BoxError;
use crate::pack::write_pack;
use crate::pinned::Pin;

/// A model tensor's handle clone, of any rank and kind.
pub(crate) trait HeldTensor: Send {
    /// Its bytes, read now (a lazy device read on CubeCL, a copy on Flex).
    fn draw(self: Box<Self>) -> burn::tensor::TensorData;
    /// Registers it, without autodiff, in `tx` (one batched eager read).
    fn register(self: Box<Self>, tx: Transaction) -> Transaction;
    /// Its first `len` bytes without a copy, where the backend keeps them in host memory in
    /// the serialized layout (a contiguous float or int tensor on Flex): a view that keeps a
    /// handle clone. `None` elsewhere (then [`HeldTensor::draw`]).
    fn view(&self, len: usize) -> Option<FlexView>;
}

impl<const D: usize, K> HeldTensor for Tensor<D, K>
where
    K: burn::tensor::kind::Transaction + burn::tensor::kind::Autodiff,
    Tensor<D, K>: Send,
{
    fn draw(self: Box<Self>) -> burn::tensor::TensorData {
        (*self).into_data()
    }
    fn register(self: Box<Self>, tx: Transaction) -> Transaction {
        tx.register((*self).inner())
    }
    fn view(&self, len: usize) -> Option<FlexView> {
        use burn::backend::{BackendTensor, DispatchTensorKind};
        let DispatchTensorKind::Flex(tensor) = self.clone().inner().into_dispatch().kind else {
            return None;
        };
        let (BackendTensor::Float(tensor) | BackendTensor::Int(tensor)) = tensor else {
            return None;
        };
        FlexView::new(tensor, len)
    }
}

/// The bytes of a Flex tensor read in place: a handle clone keeps the buffer alive and,
/// since Flex writes a buffer in place only while its handle is unique, unchanged by the
/// training that goes on.
pub(crate) struct FlexView {
    tensor: <burn::backend::Flex as burn::backend::BackendTypes>::FloatTensorPrimitive,
    len: usize,
    /// The tensor's share of [`crate::pinned_state_bytes`], given back with the view.
    pin: Option<Pin>,
}

impl FlexView {
    /// A view of the first `len` bytes of `tensor`'s buffer, where they are its elements in
    /// row-major order.
    fn new(
        tensor: <burn::backend::Flex as burn::backend::BackendTypes>::FloatTensorPrimitive,
        len: usize,
    ) -> Option<Self> {
        let layout = tensor.layout();
        let whole = layout.is_contiguous()
            && layout.start_offset() == 0
            && layout.num_elements() * tensor.dtype().size() == len
            && tensor.bytes().len() >= len;
        whole.then_some(Self {
            tensor,
            len,
            pin: None,
        })
    }

    /// Bytes that read the buffer in place and give back the handle and `pin` when dropped.
    fn into_bytes(mut self, pin: Option<Pin>) -> burn::tensor::Bytes {
        self.pin = pin;
        burn::tensor::Bytes::from_shared(
            bytes::Bytes::from_owner(self),
            burn::tensor::AllocationProperty::Native,
        )
    }
}

impl AsRef<[u8]> for FlexView {
    fn as_ref(&self) -> &[u8] {
        &self.tensor.bytes()[..self.len]
    }
}

/// The model's tensors read in one batch ([`read_model_eagerly`]): the read is enqueued on the
/// training thread's device stream at the capture, and whichever thread needs the bytes first
/// (the staging helper or the writer) waits for them and stages every slot.
pub(crate) struct EagerRead {
    pending: std::sync::Mutex<Option<PendingRead>>,
    slots: Vec<SharedSlot>,
}

/// The transaction's future, polled once (which enqueued the read).
pub(crate) type PendingRead = std::pin::Pin<
    Box<
        dyn std::future::Future<
                Output = std::result::Result<Vec<burn::tensor::TensorData>, ExecutionError>,
            > + Send,
    >,
>;

impl EagerRead {
    /// Waits for the read (once; later calls find it done) and stages its bytes into the
    /// slots, or a failure that the writer reports.
    fn resolve(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let Some(read) = pending.take() else {
            return;
        };
        let filled: Vec<Slot> = match burn::tensor::read_sync(read) {
            Ok(datas) if datas.len() == self.slots.len() => datas
                .into_iter()
                .map(|d| Slot::Staged(host_bytes(d.into_bytes())))
                .collect(),
            Ok(datas) => {
                let e = format!(
                    "the device read returned {} tensors for {}",
                    datas.len(),
                    self.slots.len()
                );
                self.slots.iter().map(|_| Slot::Failed(e.clone())).collect()
            }
            Err(e) => {
                let e = format!("reading the model from the device: {e:?}");
                self.slots.iter().map(|_| Slot::Failed(e.clone())).collect()
            }
        };
        for (slot, value) in self.slots.iter().zip(filled) {
            *lock_slot(slot) = value;
        }
    }
}

/// For a model on one device backend, enqueues one batched read of every model tensor still
/// held in `slots` on the calling (training) thread's stream, so it runs before anything the
/// trainer queues next, and releases the handles and their pins at once: the next update
/// writes the model in place however long the staging takes. The slots wait for the read
/// ([`EagerRead`]).
pub(crate) fn read_model_eagerly(slots: &[SharedSlot]) {
    let (mut batch, mut pins) = (Vec::new(), Vec::new());
    let mut tx = Transaction::default();
    for slot in slots {
        let mut guard = lock_slot(slot);
        match std::mem::replace(&mut *guard, Slot::Taken) {
            Slot::Held(tensor, pin) => {
                tx = tensor.register(tx);
                batch.push(slot.clone());
                pins.push(pin);
            }
            other => *guard = other,
        }
    }
    if batch.is_empty() {
        return;
    }
    let mut read: PendingRead = Box::pin(tx.execute_async());
    // The first poll enqueues the device-to-host copies (burn-cubecl submits them before its
    // first await) and drops the handles; it does not wait for the device.
    let polled = read
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    let eager = std::sync::Arc::new(EagerRead {
        pending: std::sync::Mutex::new(Some(match polled {
            std::task::Poll::Ready(out) => Box::pin(std::future::ready(out)),
            std::task::Poll::Pending => read,
        })),
        slots: batch,
    });
    for slot in &eager.slots {
        *lock_slot(slot) = Slot::Pending(eager.clone());
    }
    // The handles went with the first poll.
    drop(pins);
}

/// Locks `slot` once it no longer waits for a batched device read: the read is waited for
/// without the slot's lock, since it stages every slot of its batch.
pub(crate) fn lock_settled(slot: &SharedSlot) -> std::sync::MutexGuard<'_, Slot> {
    loop {
        let guard = lock_slot(slot);
        let Slot::Pending(read) = &*guard else {
            return guard;
        };
        let read = read.clone();
        drop(guard);
        read.resolve();
    }
}

/// Where one model tensor of a snapshot is: its handle (counted in
/// [`crate::pinned_state_bytes`] when the save is a background one), its staged host copy, or
/// already taken by the writer.
pub(crate) enum Slot {
    Held(Box<dyn HeldTensor>, Option<Pin>),
    /// In a batched device read enqueued at the capture (its handle already released).
    Pending(std::sync::Arc<EagerRead>),
    /// That read failed.
    Failed(String),
    Staged(burn::tensor::Bytes),
    Taken,
}

/// A slot shared by the writer and the staging helper.
pub(crate) type SharedSlot = std::sync::Arc<std::sync::Mutex<Slot>>;

pub(crate) fn lock_slot(slot: &SharedSlot) -> std::sync::MutexGuard<'_, Slot> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// Host bytes for `bytes`: a lazy device read (CubeCL) is forced into a host buffer of its own
/// so that nothing of the device allocation is kept.
pub(crate) fn host_bytes(bytes: burn::tensor::Bytes) -> burn::tensor::Bytes {
    if bytes.property() == burn::tensor::AllocationProperty::Device {
        burn::tensor::Bytes::from_bytes_vec(bytes.to_vec())
    } else {
        bytes
    }
}

/// Copies a held tensor to host memory and releases its handle (and its share of
/// [`crate::pinned_state_bytes`]); a slot in a batched device read waits for it, and one
/// already staged or taken is left as it is.
pub(crate) fn stage_slot(slot: &SharedSlot) {
    let mut guard = lock_settled(slot);
    match std::mem::replace(&mut *guard, Slot::Taken) {
        Slot::Held(held, pin) => {
            *guard = Slot::Staged(host_bytes(held.draw().into_bytes()));
            drop(pin);
        }
        other => *guard = other,
    }
}

/// One model tensor, named and ordered exactly as `Module::into_record` records it.
pub(crate) struct Entry {
    name: String,
    dtype: burn::tensor::DType,
    shape: burn::tensor::Shape,
    id: Option<u64>,
    len: usize,
    pub(crate) slot: SharedSlot,
}

impl Entry {
    /// The burnpack tensor whose bytes are taken from the slot when the writer draws it: the
    /// staged copy, else the handle, read now.
    fn into_pack_tensor(self) -> burn_pack::Tensor {
        let Entry {
            name,
            dtype,
            shape,
            id,
            len,
            slot,
        } = self;
        burn_pack::Tensor::deferred(name, dtype, shape, id, len, move || {
            let mut guard = lock_settled(&slot);
            match std::mem::replace(&mut *guard, Slot::Taken) {
                Slot::Staged(bytes) => Ok(bytes),
                Slot::Held(held, pin) => {
                    drop(guard);
                    // Read in place where the backend allows (handle and pin go once the
                    // bytes are written), else copied (they go at once).
                    if let Some(view) = held.view(len) {
                        return Ok(view.into_bytes(pin));
                    }
                    let data = held.draw();
                    drop(pin);
                    Ok(data.into_bytes())
                }
                Slot::Failed(e) => Err(burn_pack::Error::IoError(e)),
                // A settled slot is never pending.
                Slot::Taken | Slot::Pending(_) => {
                    Err(burn_pack::Error::IoError("tensor drawn twice".into()))
                }
            }
        })
    }
}

/// Collects a module's parameters as [`Entry`]s holding handle clones, named and ordered
/// exactly as `Module::into_record` records them (module path, `on_save` form).
#[derive(Default)]
pub(crate) struct DeferredCollector {
    path: Vec<String>,
    entries: Vec<Entry>,
    /// Count each handle in [`crate::pinned_state_bytes`] until it is staged or drawn.
    pin: bool,
    /// The first parameter's device, and whether a later one was on another.
    device: Option<burn::tensor::Device>,
    several_devices: bool,
}

impl DeferredCollector {
    fn note_device(&mut self, device: burn::tensor::Device) {
        match &self.device {
            None => self.device = Some(device),
            Some(first) => self.several_devices |= *first != device,
        }
    }

    fn push(
        &mut self,
        id: ParamId,
        dtype: burn::tensor::DType,
        shape: Vec<usize>,
        held: Box<dyn HeldTensor>,
    ) {
        let name = self.path.join(".");
        let id = Some(id.val());
        let entry = if matches!(dtype, burn::tensor::DType::QFloat(_)) {
            // Packed quantized data has no size formula: take it now.
            let (bytes, shape, dtype) = held.draw().into_parts();
            let bytes = host_bytes(bytes);
            Entry {
                name,
                dtype,
                shape,
                id,
                len: bytes.len(),
                slot: std::sync::Arc::new(std::sync::Mutex::new(Slot::Staged(bytes))),
            }
        } else {
            let len = shape.iter().product::<usize>() * dtype.size();
            let pin = self.pin.then(|| Pin::new(len as u64));
            Entry {
                name,
                dtype,
                shape: shape.into(),
                id,
                len,
                slot: std::sync::Arc::new(std::sync::Mutex::new(Slot::Held(held, pin))),
            }
        };
        self.entries.push(entry);
    }
}

impl ModuleVisitor for DeferredCollector {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = param.transform_for_save().val();
        self.note_device(t.device());
        let (dtype, shape) = (t.dtype(), t.shape().iter().copied().collect());
        self.push(param.id, dtype, shape, Box::new(t));
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        let t = param.transform_for_save().val();
        self.note_device(t.device());
        let (dtype, shape) = (t.dtype(), t.shape().iter().copied().collect());
        self.push(param.id, dtype, shape, Box::new(t));
    }
    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        let t = param.transform_for_save().val();
        self.note_device(t.device());
        let (dtype, shape) = (t.dtype(), t.shape().iter().copied().collect());
        self.push(param.id, dtype, shape, Box::new(t));
    }
}

/// `model`'s parameters as entries holding handle clones (counted in
/// [`crate::pinned_state_bytes`] when `pin`), and the device they all live on (`None` where
/// they live on several, or there are none). `model` is dropped, so a tensor the trainer has
/// since replaced is held only here.
pub(crate) fn collect_model<M: Module>(
    model: M,
    pin: bool,
) -> (Vec<Entry>, Option<burn::tensor::Device>) {
    let mut collector = DeferredCollector {
        pin,
        ..Default::default()
    };
    model.visit(&mut collector);
    drop(model);
    let device = collector.device.filter(|_| !collector.several_devices);
    (collector.entries, device)
}

/// Streams the model record of `entries` into `sink`: the bytes of
/// `model.into_record().save(..)`, one tensor at a time, each freed once written.
pub(crate) fn write_entries(
    entries: Vec<Entry>,
    sink: &mut dyn Write,
) -> std::result::Result<u64, BoxError> {
    let tensors = entries.into_iter().map(Entry::into_pack_tensor).collect();
    let none = std::collections::BTreeMap::new();
    Ok(write_pack(
        tensors,
        &none,
        &std::collections::BTreeMap::new(),
        sink,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    fn weights(n: usize) -> Tensor<2> {
        let values: Vec<f32> = (0..n * n).map(|i| i as f32 * 0.5).collect();
        Tensor::from_data(TensorData::new(values, [n, n]), &Device::flex())
    }

    #[test]
    fn a_held_flex_tensor_is_written_from_its_own_buffer() {
        let t = weights(64);
        let len = 64 * 64 * 4;
        let buffer = t.clone().into_dispatch().kind;
        let burn::backend::DispatchTensorKind::Flex(burn::backend::BackendTensor::Float(flex)) =
            buffer
        else {
            panic!("a Flex float tensor");
        };
        let held: Box<dyn HeldTensor> = Box::new(t.clone());
        let view = held
            .view(len)
            .expect("a contiguous Flex tensor is viewed in place");
        let bytes = view.into_bytes(None);
        assert_eq!(bytes.len(), len);
        assert_eq!(
            bytes.as_ptr(),
            flex.bytes().as_ptr(),
            "the view is the tensor's own buffer, not a copy"
        );
        assert_eq!(&bytes[..], &t.clone().into_data().bytes()[..]);
    }

    #[test]
    fn a_held_model_entry_is_written_without_a_copy() {
        let t = weights(48);
        let burn::backend::DispatchTensorKind::Flex(burn::backend::BackendTensor::Float(flex)) =
            t.clone().into_dispatch().kind
        else {
            panic!("a Flex float tensor");
        };
        let mut collector = DeferredCollector::default();
        let (dtype, shape) = (t.dtype(), t.shape().iter().copied().collect());
        collector.push(ParamId::new(), dtype, shape, Box::new(t.clone()));
        let entry = collector.entries.pop().expect("one entry");
        let bytes = entry
            .into_pack_tensor()
            .into_bytes()
            .expect("the writer draws the entry");
        assert_eq!(
            bytes.as_ptr(),
            flex.bytes().as_ptr(),
            "the writer reads the held tensor's own buffer"
        );
        assert_eq!(&bytes[..], &t.into_data().bytes()[..]);
    }

    #[test]
    fn training_after_the_capture_does_not_change_a_view() {
        let t = weights(32);
        let before = t.clone().into_data();
        let held: Box<dyn HeldTensor> = Box::new(t.clone());
        let bytes = held.view(32 * 32 * 4).expect("viewed").into_bytes(None);
        drop(held);
        // The trainer's update: its handle is no longer unique, so Flex copies on write.
        let updated = t.mul_scalar(3.0).add_scalar(1.0);
        assert_ne!(updated.into_data(), before);
        assert_eq!(&bytes[..], &before.bytes()[..]);
    }

    #[test]
    fn a_view_keeps_its_pin_until_dropped_and_odd_layouts_are_drawn() {
        let t = weights(16);
        let held: Box<dyn HeldTensor> = Box::new(t.clone());
        let before = crate::pinned_state_bytes();
        let bytes = held
            .view(16 * 16 * 4)
            .expect("viewed")
            .into_bytes(Some(Pin::new(1 << 40)));
        assert!(crate::pinned_state_bytes() >= before + (1 << 40));
        drop(bytes);
        assert!(crate::pinned_state_bytes() < 1 << 40);
        // A transposed view is not in the serialized layout: no in-place read.
        let held: Box<dyn HeldTensor> = Box::new(t.clone().transpose());
        assert!(held.view(16 * 16 * 4).is_none());
        // Nor is a length that is not the tensor's.
        let held: Box<dyn HeldTensor> = Box::new(t);
        assert!(held.view(16 * 16 * 4 + 4).is_none());
    }
}
