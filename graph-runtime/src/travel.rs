//! Values that travel between processes: what an edge whose producer and consumer live in
//! different processes (the MPI backend) sends as bytes.
//!
//! A value is written by [`Travel::encode`] into a [`Writer`]: small data inline, in the
//! message's head, and every large contiguous buffer of plain elements (a tensor's, a
//! `Vec<f32>`'s) as a part of its own, sent straight from where it lies: no serializer,
//! no copy. The consumer's [`Reader`] reads the head and receives each large part straight
//! into the buffer of the value it builds. A fan-out (one value read by several processes)
//! encodes once and sends the same head and parts to each.
//!
//! Not every edge's value must travel: only those whose two ends are in different
//! processes. So nothing here is required of an edge's type; `graph!` asks, at launch,
//! through [`Probe`] (autoref specialization), whether the type implements [`Travel`] or,
//! with feature `serde`, serde's traits (encoded with postcard), and a launch whose
//! crossing edge carries a type that can do neither is [`Error::CannotTravel`].
//!
//! Both processes run the same program on machines of the same byte order (as MPI
//! programs launched by `mpirun` over one architecture do): elements go as their
//! in-memory bytes.
//!
//! ```
//! use actorgraph::travel::{Probe, ViaTravel as _, ViaSerde as _, NoTravel as _};
//! use actorgraph::Tensor;
//!
//! struct Opaque;
//! assert!((&&&Probe::<(Tensor<f32>, Vec<i64>, u8)>::NEW).codec().is_some());
//! assert!((&&&Probe::<Opaque>::NEW).codec().is_none());
//! ```

use std::marker::PhantomData;
use std::sync::Arc;

use crate::error::caught;
use crate::{Element, Error, Tensor};

/// Buffers of at most this many bytes go inline, in the message's head; larger ones as a
/// part of their own, sent from and received into the value's own memory.
pub const INLINE: usize = 2048;

/// A value that can travel between processes (see the module docs).
///
/// Implemented for [`Tensor<E>`](Tensor), the element types, `bool`, `usize`, `isize`,
/// `()`, `String`, `Vec<T>`, `Option<T>`, `Box<T>` and tuples of up to eight values that
/// travel. With feature `serde`, a type that implements `Serialize` and
/// `DeserializeOwned` travels too (through postcard) without implementing this trait.
///
/// ```
/// use actorgraph::travel::{decode, encode, Travel};
/// let v = (vec![1.5f32, 2.5], 7u64, String::from("w"));
/// assert_eq!(decode::<(Vec<f32>, u64, String)>(&encode(&v)), Some(v));
/// ```
pub trait Travel: Sized + Send + 'static {
    /// Writes the value.
    fn encode(&self, w: &mut Writer);
    /// Reads a value that [`encode`](Travel::encode) wrote; `None` if the bytes are not
    /// one (a peer's bug, or another program).
    fn decode(r: &mut Reader<'_>) -> Option<Self>;

    /// Writes a slice of values: each in turn, unless the type has a faster way (an
    /// element type writes its raw bytes, as one part when large).
    #[doc(hidden)]
    fn encode_slice(items: &[Self], w: &mut Writer) {
        w.put_len(items.len());
        items.iter().for_each(|i| i.encode(w));
    }

    /// Reads what [`encode_slice`](Travel::encode_slice) wrote.
    #[doc(hidden)]
    fn decode_vec(r: &mut Reader<'_>) -> Option<Vec<Self>> {
        let n = r.take_len()?;
        // Each value takes at least a byte or a part: a corrupt count cannot make a huge
        // allocation.
        let mut out = Vec::with_capacity(n.min(r.remaining()));
        for _ in 0..n {
            out.push(Self::decode(r)?);
        }
        Some(out)
    }
}

/// A large buffer of a value, sent as a message of its own from where it lies (for a
/// backend's [`Port`](crate::comm::Port)).
#[derive(Clone, Copy)]
pub struct Part {
    ptr: *const u8,
    len: usize,
}

impl Part {
    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the part has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    ///
    /// # Safety
    /// The value the part was lent from is alive and unchanged: the [`Outgoing`] whose
    /// writer holds the part is.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: the caller keeps the lending value alive and unchanged, so the part
        // still points to `len` initialized bytes that nothing writes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Where a value is written: the head's bytes, and the large buffers it lends.
#[derive(Default)]
pub struct Writer {
    head: Vec<u8>,
    parts: Vec<Part>,
    /// Why the value could not be written, if it could not (see [`Writer::fail`]).
    failed: Option<String>,
}

// SAFETY: a `Writer` holds `Part`s, raw pointers into the value it encoded. The runtime
// keeps that value alive and unchanged, next to the writer, until every send of it is
// complete (`Outgoing`), and only reads through the pointers: sharing or moving them
// between threads is no different from sharing `&[u8]`.
unsafe impl Send for Writer {}
// SAFETY: as for `Send`: the parts are read-only.
unsafe impl Sync for Writer {}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes to the head.
    pub fn put(&mut self, bytes: &[u8]) {
        self.head.extend_from_slice(bytes);
    }

    /// Appends a `u64`.
    pub fn put_u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }

    /// Appends a length.
    pub fn put_len(&mut self, n: usize) {
        self.put_u64(n as u64);
    }

    /// The head written so far, for an encoder that appends to a `Vec` itself.
    pub fn head_mut(&mut self) -> &mut Vec<u8> {
        &mut self.head
    }

    /// Writes a buffer of elements: its length, then its bytes, inline when small, else
    /// lent as a part (the value that holds `items` must stay alive and unchanged until
    /// the message is sent: the runtime keeps the encoded value for that).
    fn elements<E: Element>(&mut self, items: &[E]) {
        let bytes = element_bytes(items);
        self.put_len(items.len());
        if bytes.len() <= INLINE {
            self.put(bytes);
        } else {
            self.parts.push(Part {
                ptr: bytes.as_ptr(),
                len: bytes.len(),
            });
        }
    }

    /// Marks the encoding as failed, with why (the first reason is kept): the value is
    /// not sent, and its producer's step fails with a typed error naming the edge. For an
    /// encoder that met an error it cannot write (a GPU tensor whose copy to the host
    /// failed).
    ///
    /// ```
    /// use actorgraph::travel::Writer;
    /// let mut w = Writer::new();
    /// w.fail("no");
    /// w.fail("later");
    /// assert_eq!(w.failure(), Some("no"));
    /// ```
    pub fn fail(&mut self, why: impl Into<String>) {
        self.failed.get_or_insert_with(|| why.into());
    }

    /// Why the encoding failed, if [`fail`](Writer::fail) was called.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// The head.
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// The parts, in the order the reader takes them.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }
}

/// The bytes of a slice of elements.
fn element_bytes<E: Element>(items: &[E]) -> &[u8] {
    // SAFETY: `Element` is sealed and implemented only for the ten primitive numeric types
    // (`half`'s are `repr(transparent)` over `u16`): plain data without padding, so every
    // byte of the slice is initialized. The bytes borrow `items` for the same lifetime.
    unsafe { std::slice::from_raw_parts(items.as_ptr().cast::<u8>(), std::mem::size_of_val(items)) }
}

/// `n` elements, their bytes filled by `fill`.
fn elements_from<E: Element>(n: usize, fill: impl FnOnce(&mut [u8]) -> bool) -> Option<Vec<E>> {
    let mut v: Vec<E> = Vec::with_capacity(n);
    let bytes = n.checked_mul(std::mem::size_of::<E>())?;
    // SAFETY: the capacity holds `n` elements, `bytes` bytes; the slice covers exactly the
    // spare capacity, which nothing else references. It may be uninitialized: `fill`
    // only writes it (a receive, a copy).
    let raw = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), bytes) };
    if !fill(raw) {
        return None;
    }
    // SAFETY: `fill` wrote all `n * size_of::<E>()` bytes, and every bit pattern is a valid
    // element (plain numeric types, see `element_bytes`).
    unsafe { v.set_len(n) };
    Some(v)
}

/// Where a value is read from: a message's head, and a way to receive its parts.
pub struct Reader<'a> {
    head: &'a [u8],
    parts: &'a [u64],
    next_part: usize,
    fill: &'a mut dyn FnMut(&mut [u8]) -> bool,
}

impl<'a> Reader<'a> {
    /// A reader of `head`, whose parts have the lengths `parts` and are received, in
    /// order, by `fill` (false: the part did not come).
    pub fn new(
        head: &'a [u8],
        parts: &'a [u64],
        fill: &'a mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Self {
        Self {
            head,
            parts,
            next_part: 0,
            fill,
        }
    }

    /// The next `n` bytes of the head.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.head.split_at_checked(n)?;
        self.head = rest;
        Some(taken)
    }

    /// The next `u64`.
    pub fn take_u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    /// The next length.
    pub fn take_len(&mut self) -> Option<usize> {
        usize::try_from(self.take_u64()?).ok()
    }

    /// What is left to read: the head's bytes and the parts.
    fn remaining(&self) -> usize {
        self.head.len() + self.parts.len() - self.next_part
    }

    /// Whether everything was read.
    pub(crate) fn is_done(&self) -> bool {
        self.head.is_empty() && self.next_part == self.parts.len()
    }

    /// The parts not read (a failed decode leaves some, which the transport drops).
    pub fn parts_left(&self) -> usize {
        self.parts.len() - self.next_part
    }

    /// Reads what [`Writer::elements`] wrote.
    fn elements<E: Element>(&mut self) -> Option<Vec<E>> {
        let n = self.take_len()?;
        let bytes = n.checked_mul(std::mem::size_of::<E>())?;
        if bytes <= INLINE {
            let src = self.take(bytes)?;
            return elements_from(n, |dst| {
                dst.copy_from_slice(src);
                true
            });
        }
        // A part of exactly this size, announced in the head: checked before allocating.
        let &len = self.parts.get(self.next_part)?;
        if len != bytes as u64 {
            return None;
        }
        self.next_part += 1;
        elements_from(n, |dst| (self.fill)(dst))
    }
}

/// The bytes of a value without large parts, for tests and for small values: the head
/// only. See [`decode`].
///
/// # Panics
/// If the value lends parts (a buffer over [`INLINE`] bytes): those travel on their own.
pub fn encode<T: Travel>(value: &T) -> Vec<u8> {
    let mut w = Writer::new();
    value.encode(&mut w);
    assert!(
        w.parts.is_empty(),
        "`encode` takes values without large buffers"
    );
    w.head
}

/// Reads what [`encode`] wrote.
pub fn decode<T: Travel>(bytes: &[u8]) -> Option<T> {
    let mut no_parts = |_: &mut [u8]| false;
    let mut r = Reader::new(bytes, &[], &mut no_parts);
    let v = T::decode(&mut r)?;
    r.is_done().then_some(v)
}

macro_rules! travel_element {
    ($($d:ident: $t:ty [$name:literal, $kind:ident, $doc:literal]),*) => {$(
        impl Travel for $t {
            fn encode(&self, w: &mut Writer) {
                w.put(element_bytes(std::slice::from_ref(self)));
            }
            fn decode(r: &mut Reader<'_>) -> Option<Self> {
                let bytes = r.take(std::mem::size_of::<$t>())?;
                elements_from::<$t>(1, |dst| {
                    dst.copy_from_slice(bytes);
                    true
                })?
                .pop()
            }
            fn encode_slice(items: &[Self], w: &mut Writer) {
                w.elements(items);
            }
            fn decode_vec(r: &mut Reader<'_>) -> Option<Vec<Self>> {
                r.elements()
            }
        }
    )*};
}
crate::element::for_each_dtype!(travel_element);

impl<E: Element> Travel for Tensor<E> {
    fn encode(&self, w: &mut Writer) {
        w.put_len(self.shape().len());
        self.shape().iter().for_each(|&d| w.put_len(d));
        match self.host_slice() {
            Some(items) => w.elements(items),
            // A GPU tensor (feature `nccl`) goes through the host: its copy is a value of
            // its own, which the head holds. It arrives as a host tensor.
            None => encode_from_device(self, w),
        }
    }

    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        let ndim = r.take_len()?;
        let mut shape = Vec::with_capacity(ndim.min(r.remaining()));
        for _ in 0..ndim {
            shape.push(r.take_len()?);
        }
        let data = r.elements::<E>()?;
        Tensor::from_vec(data, shape).ok()
    }
}

/// A GPU tensor's elements, through a host copy.
#[cfg(feature = "nccl")]
fn encode_from_device<E: Element>(t: &Tensor<E>, w: &mut Writer) {
    match t.to_host() {
        Ok(host) => {
            let items = host.host_slice().unwrap_or_default();
            w.put_len(items.len());
            w.put(element_bytes(items));
        }
        Err(e) => w.fail(format!("its copy from the GPU failed: {e}")),
    }
}

/// Without a GPU backend every tensor is on the host: never called.
#[cfg(not(feature = "nccl"))]
fn encode_from_device<E: Element>(_: &Tensor<E>, w: &mut Writer) {
    w.fail("its elements are not in host memory");
}

impl<T: Travel> Travel for Vec<T> {
    fn encode(&self, w: &mut Writer) {
        T::encode_slice(self, w);
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        T::decode_vec(r)
    }
}

impl<T: Travel> Travel for Option<T> {
    fn encode(&self, w: &mut Writer) {
        match self {
            None => w.put(&[0]),
            Some(v) => {
                w.put(&[1]);
                v.encode(w);
            }
        }
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        match r.take(1)? {
            [0] => Some(None),
            [1] => Some(Some(T::decode(r)?)),
            _ => None,
        }
    }
}

impl<T: Travel> Travel for Box<T> {
    fn encode(&self, w: &mut Writer) {
        (**self).encode(w);
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        T::decode(r).map(Box::new)
    }
}

impl Travel for bool {
    fn encode(&self, w: &mut Writer) {
        w.put(&[u8::from(*self)]);
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        match r.take(1)? {
            [0] => Some(false),
            [1] => Some(true),
            _ => None,
        }
    }
}

impl Travel for usize {
    fn encode(&self, w: &mut Writer) {
        w.put_len(*self);
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        r.take_len()
    }
}

impl Travel for isize {
    fn encode(&self, w: &mut Writer) {
        w.put(&(*self as i64).to_le_bytes());
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        let v = i64::from_le_bytes(r.take(8)?.try_into().ok()?);
        isize::try_from(v).ok()
    }
}

impl Travel for String {
    fn encode(&self, w: &mut Writer) {
        w.put_len(self.len());
        w.put(self.as_bytes());
    }
    fn decode(r: &mut Reader<'_>) -> Option<Self> {
        let n = r.take_len()?;
        String::from_utf8(r.take(n)?.to_vec()).ok()
    }
}

impl Travel for () {
    fn encode(&self, _: &mut Writer) {}
    fn decode(_: &mut Reader<'_>) -> Option<Self> {
        Some(())
    }
}

macro_rules! travel_tuple {
    ($($t:ident $v:ident),+) => {
        impl<$($t: Travel),+> Travel for ($($t,)+) {
            fn encode(&self, w: &mut Writer) {
                let ($($v,)+) = self;
                $($v.encode(w);)+
            }
            fn decode(r: &mut Reader<'_>) -> Option<Self> {
                Some(($($t::decode(r)?,)+))
            }
        }
    };
}
travel_tuple!(A a);
travel_tuple!(A a, B b);
travel_tuple!(A a, B b, C c);
travel_tuple!(A a, B b, C c, D d);
travel_tuple!(A a, B b, C c, D d, E e);
travel_tuple!(A a, B b, C c, D d, E e, F f);
travel_tuple!(A a, B b, C c, D d, E e, F f, G g);
travel_tuple!(A a, B b, C c, D d, E e, F f, G g, H h);

/// How an edge's value type travels: chosen at launch by [`Probe`].
pub struct Codec<T> {
    /// Writes a value; `Err` says why it cannot (a serde type whose `Serialize` failed).
    pub(crate) encode: fn(&T, &mut Writer) -> Result<(), String>,
    /// Reads a value.
    pub(crate) decode: fn(&mut Reader<'_>) -> Option<T>,
}

impl<T> Codec<T> {
    /// Reads a value: `Ok(None)` if the bytes do not hold one, `Err` if the decoder (the
    /// user's, perhaps) panicked. Either way the caller still owns the stream and keeps it
    /// in step.
    pub(crate) fn read(&self, r: &mut Reader<'_>) -> Result<Option<T>, String> {
        caught(|| (self.decode)(r))
    }
}

impl<T> Clone for Codec<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Codec<T> {}

/// Asks, without requiring it, whether `T` can travel: `(&&&Probe::<T>::NEW).codec()`
/// with [`ViaTravel`], [`ViaSerde`] and [`NoTravel`] in scope is a [`Codec`] through
/// [`Travel`] if `T` implements it, else through serde (feature `serde`) if `T` implements
/// its traits, else `None`. (Method resolution tries `&&Probe`, then `&Probe`, then
/// `Probe`: the first whose impl applies wins.) `graph!` emits this for each edge's type.
pub struct Probe<T>(PhantomData<fn() -> T>);

impl<T> Probe<T> {
    /// The probe.
    pub const NEW: Self = Probe(PhantomData);
}

/// The [`Travel`] branch of [`Probe`].
pub trait ViaTravel<T> {
    /// The codec.
    fn codec(&self) -> Option<Codec<T>>;
}

impl<T: Travel> ViaTravel<T> for &&Probe<T> {
    fn codec(&self) -> Option<Codec<T>> {
        Some(Codec {
            encode: |v, w| {
                v.encode(w);
                w.failure().map_or(Ok(()), |why| Err(why.to_string()))
            },
            decode: T::decode,
        })
    }
}

/// The serde branch of [`Probe`] (applies with feature `serde` only).
pub trait ViaSerde<T> {
    /// The codec.
    fn codec(&self) -> Option<Codec<T>>;
}

#[cfg(feature = "serde")]
impl<T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static> ViaSerde<T> for &Probe<T> {
    fn codec(&self) -> Option<Codec<T>> {
        Some(Codec {
            encode: |v, w| {
                let head = w.head_mut();
                let at = head.len();
                head.extend_from_slice(&[0; 8]);
                let head = postcard::to_extend(v, std::mem::take(head)).map_err(|e| e.to_string());
                let mut head = head?;
                let len = (head.len() - at - 8) as u64;
                head[at..at + 8].copy_from_slice(&len.to_le_bytes());
                *w.head_mut() = head;
                Ok(())
            },
            decode: |r| {
                let n = r.take_len()?;
                postcard::from_bytes(r.take(n)?).ok()
            },
        })
    }
}

/// The fallback of [`Probe`]: the type cannot travel.
pub trait NoTravel<T> {
    /// `None`.
    fn codec(&self) -> Option<Codec<T>>;
}

impl<T> NoTravel<T> for Probe<T> {
    fn codec(&self) -> Option<Codec<T>> {
        None
    }
}

/// A value on its way to other processes: its encoding and the value itself, kept alive
/// and unchanged (its large buffers are sent from where they lie) until every send of it
/// is complete.
pub struct Outgoing {
    writer: Writer,
    // Never read: it only keeps the value's memory alive. (`Mutex` makes it `Sync`
    // without asking `Sync` of the value.)
    _kept: std::sync::Mutex<Box<dyn std::any::Any + Send>>,
}

impl Outgoing {
    /// Encodes `value` with `codec`; the value moves into the result, which keeps it.
    pub(crate) fn new<T: Send + 'static>(value: T, codec: &Codec<T>) -> Result<Arc<Self>, String> {
        // Boxed first: the encoding may point into the value's own memory, which must not
        // move afterwards.
        let kept = Box::new(value);
        let mut writer = Writer::new();
        // The encoder may be the user's (`Travel`, `Serialize`): its panic is this
        // value's error, not the step's, so that the step still tells its consumers.
        caught(|| (codec.encode)(&kept, &mut writer))??;
        Ok(Arc::new(Outgoing {
            writer,
            _kept: std::sync::Mutex::new(kept),
        }))
    }

    /// The encoding.
    pub fn writer(&self) -> &Writer {
        &self.writer
    }
}

/// The error of a launch whose edge must carry `T` across processes and cannot.
pub(crate) fn cannot_travel<T>(
    value: &'static str,
    from_group: &'static str,
    to_group: &'static str,
) -> Error {
    Error::CannotTravel {
        value,
        ty: std::any::type_name::<T>(),
        from_group,
        to_group,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::half::bf16;

    fn round_trip<T: Travel>(v: &T) -> Option<T> {
        let mut w = Writer::new();
        v.encode(&mut w);
        let lens: Vec<u64> = w.parts.iter().map(|p| p.len as u64).collect();
        let mut parts = w.parts.iter();
        let mut fill = |dst: &mut [u8]| {
            // SAFETY: `v` is alive and unchanged.
            let src = unsafe { parts.next().unwrap().bytes() };
            dst.copy_from_slice(src);
            true
        };
        let mut r = Reader::new(&w.head, &lens, &mut fill);
        let out = T::decode(&mut r)?;
        r.is_done().then_some(out)
    }

    #[test]
    fn values_round_trip_small_and_large() {
        let t = Tensor::from_vec((0..12).map(|i| i as f32).collect(), [3, 4]).unwrap();
        let back = round_trip(&t).unwrap();
        assert_eq!((back.shape(), back.to_vec()), (t.shape(), t.to_vec()));
        // 1 MiB: one part, lent from the tensor's own buffer.
        let big = Tensor::full([512, 512], bf16::from_f32(1.5));
        let mut w = Writer::new();
        big.encode(&mut w);
        assert_eq!(w.parts.len(), 1);
        assert_eq!(w.parts[0].ptr, big.as_slice().as_ptr().cast());
        assert_eq!(round_trip(&big).unwrap().to_vec(), big.to_vec());
        let v = (
            vec![1u8; 5000],
            -3i64,
            (true, String::from("x")),
            Some(2usize),
        );
        assert_eq!(round_trip(&v), Some(v));
        assert_eq!(
            round_trip(&Tensor::scalar(7i32)).unwrap().shape(),
            &[] as &[usize]
        );
    }

    /// A user type whose `Travel` panics: writing when `0`, reading when `1`.
    struct Grumpy(u8);

    impl Travel for Grumpy {
        fn encode(&self, w: &mut Writer) {
            assert_ne!(self.0, 0, "no writing today");
            self.0.encode(w);
        }
        fn decode(r: &mut Reader<'_>) -> Option<Self> {
            let b = u8::decode(r)?;
            assert_ne!(b, 1, "no reading today");
            Some(Grumpy(b))
        }
    }

    #[test]
    fn a_user_codec_that_panics_is_an_error_on_either_side() {
        let codec = (&&&Probe::<Grumpy>::NEW).codec().unwrap();
        let why = Outgoing::new(Grumpy(0), &codec).err().unwrap();
        assert!(why.starts_with("it panicked: "), "{why}");
        assert!(why.contains("no writing today"), "{why}");
        let read = |b: u8| {
            let out = Outgoing::new(Grumpy(b), &codec).unwrap();
            let mut fill = |_: &mut [u8]| true;
            let mut r = Reader::new(out.writer().head(), &[], &mut fill);
            codec.read(&mut r).map(|g| g.map(|g| g.0))
        };
        assert_eq!(read(2), Ok(Some(2)));
        let why = read(1).unwrap_err();
        assert!(why.contains("no reading today"), "{why}");
    }

    #[test]
    fn garbage_is_refused_not_a_panic() {
        assert_eq!(decode::<Vec<f64>>(&[255; 8]), None);
        assert_eq!(decode::<bool>(&[2]), None);
        assert_eq!(
            decode::<Tensor<f32>>(&encode(&(1usize, 3usize, 2usize))),
            None
        );
        // Trailing bytes: not one value.
        assert_eq!(decode::<u8>(&[1, 2]), None);
    }
}
