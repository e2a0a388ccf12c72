//! Integer handles from a generation-checked table (the idea of ffi-support's HandleMap).
//!
//! A handle packs a kind tag, a generation and a slot index. Freeing a slot bumps its
//! generation, so a stale, double-freed or forged handle is recognised and refused instead
//! of reaching freed memory. A slot whose generation is used up is retired, never reused:
//! no handle is ever issued twice in the life of a process. 0 is never a valid handle.

use crate::sync::{Arc, Mutex, MutexGuard};

const INDEX_BITS: u32 = 32;
const GENERATION_BITS: u32 = 24;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;

/// Which table a handle belongs to; a client handle passed as a lock is refused.
#[derive(Clone, Copy)]
#[repr(u8)]
pub(crate) enum Kind {
    Client = 0xC1,
    Lock = 0x10,
    Cancel = 0xCA,
}

struct Slot<T> {
    generation: u64,
    /// `None` while free or reserved.
    value: Option<Arc<T>>,
    reserved: bool,
}

struct Table<T> {
    slots: Vec<Slot<T>>,
    free: Vec<usize>,
}

/// A table of `Arc<T>` behind integer handles. Thread-safe.
pub(crate) struct HandleTable<T> {
    kind: Kind,
    table: Mutex<Table<T>>,
}

impl<T> HandleTable<T> {
    pub const fn new(kind: Kind) -> Self {
        HandleTable {
            kind,
            table: Mutex::new(Table {
                slots: Vec::new(),
                free: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table<T>> {
        crate::sync::lock(&self.table)
    }

    /// The table's lock, held by the caller until it drops what this returns (across a
    /// `fork()`: see [`crate::process`]).
    #[cfg(not(feature = "shuttle"))]
    pub fn hold(&'static self) -> impl std::any::Any
    where
        T: 'static,
    {
        self.lock()
    }

    fn encode(&self, index: usize, generation: u64) -> u64 {
        ((self.kind as u64) << (INDEX_BITS + GENERATION_BITS))
            | (generation << INDEX_BITS)
            | (index as u64 + 1)
    }

    fn decode(&self, handle: u64) -> Option<(usize, u64)> {
        if handle >> (INDEX_BITS + GENERATION_BITS) != self.kind as u64 {
            return None;
        }
        let index = (handle & u64::from(u32::MAX)).checked_sub(1)?;
        let generation = (handle >> INDEX_BITS) & GENERATION_MASK;
        Some((usize::try_from(index).ok()?, generation))
    }

    /// Reserves a handle, runs `make` with it (without holding the table's lock), and
    /// stores the value; frees the handle again if `make` fails.
    pub fn insert_with<E>(&self, make: impl FnOnce(u64) -> Result<T, E>) -> Result<u64, E> {
        let (handle, index) = self.reserve();
        let result = make(handle);
        let mut t = self.lock();
        t.slots[index].reserved = false;
        match result {
            Ok(value) => {
                t.slots[index].value = Some(Arc::new(value));
                Ok(handle)
            }
            Err(e) => {
                Self::retire(&mut t, index);
                Err(e)
            }
        }
    }

    pub fn insert(&self, value: T) -> u64 {
        let (handle, index) = self.reserve();
        let mut t = self.lock();
        t.slots[index].reserved = false;
        t.slots[index].value = Some(Arc::new(value));
        handle
    }

    fn reserve(&self) -> (u64, usize) {
        let mut t = self.lock();
        let index = match t.free.pop() {
            Some(index) => index,
            None => {
                t.slots.push(Slot {
                    generation: 1,
                    value: None,
                    reserved: false,
                });
                t.slots.len() - 1
            }
        };
        let slot = &mut t.slots[index];
        slot.reserved = true;
        (self.encode(index, slot.generation), index)
    }

    /// The value behind a live handle.
    pub fn get(&self, handle: u64) -> Option<Arc<T>> {
        let (index, generation) = self.decode(handle)?;
        let t = self.lock();
        let slot = t.slots.get(index)?;
        (slot.generation == generation)
            .then(|| slot.value.clone())
            .flatten()
    }

    /// Removes a live handle, returning its value; the handle is invalid from then on.
    pub fn remove(&self, handle: u64) -> Option<Arc<T>> {
        let (index, generation) = self.decode(handle)?;
        let mut t = self.lock();
        let slot = t.slots.get_mut(index)?;
        if slot.generation != generation || slot.reserved {
            return None;
        }
        let value = slot.value.take()?;
        Self::retire(&mut t, index);
        Some(value)
    }

    /// Removes every value for which `pred` holds.
    pub fn remove_where(&self, pred: impl Fn(&T) -> bool) -> Vec<Arc<T>> {
        let mut t = self.lock();
        let mut removed = Vec::new();
        for index in 0..t.slots.len() {
            if t.slots[index].value.as_deref().is_some_and(&pred) {
                removed.extend(t.slots[index].value.take());
                Self::retire(&mut t, index);
            }
        }
        removed
    }

    /// Frees a slot for reuse under its next generation, or retires it for good when its
    /// generations are used up (wrapping would reissue a handle given out before).
    fn retire(t: &mut Table<T>, index: usize) {
        let slot = &mut t.slots[index];
        if slot.generation < GENERATION_MASK {
            slot.generation += 1;
            t.free.push(index);
        }
    }
}

/// Why [`insert_child`] stored nothing, or took back what it stored.
pub(crate) enum ChildError<E, C> {
    /// The parent's handle is not live.
    NoParent,
    /// Making the child failed.
    Make(E),
    /// The parent was closed while the child was being made: the child was taken out
    /// again, here (`Some`: the caller gives it back) or by the close (`None`).
    Orphaned(Option<Arc<C>>),
}

/// Stores in `children` a child of the live handle `parent` of `parents`: runs `make` with
/// the parent and the child's handle (holding no table's lock: it may block), stores what
/// it returns, and keeps it only if the parent is still live then. Together with
/// [`close_parent`], every child made while its parent is closed is taken out by exactly
/// one of the two: none stays behind its closed parent, none is taken twice.
pub(crate) fn insert_child<P, C, E>(
    parents: &HandleTable<P>,
    children: &HandleTable<C>,
    parent: u64,
    make: impl FnOnce(Arc<P>, u64) -> Result<C, E>,
) -> Result<u64, ChildError<E, C>> {
    let live = parents.get(parent).ok_or(ChildError::NoParent)?;
    let handle = children
        .insert_with(|handle| make(live, handle))
        .map_err(ChildError::Make)?;
    // A close of the parent that ran during `make` could not take this child: it was not
    // stored yet. (Whichever of the two removes the child has it: the close takes the
    // parent out before it looks for its children.)
    if parents.get(parent).is_none() {
        return Err(ChildError::Orphaned(children.remove(handle)));
    }
    Ok(handle)
}

/// Closes `parent`: takes it out of `parents`, then every child of it (`of` names a
/// child's parent) out of `children`, in that order (see [`insert_child`]). `None` when
/// `parent` is not live (unknown, or closed already).
pub(crate) fn close_parent<P, C>(
    parents: &HandleTable<P>,
    children: &HandleTable<C>,
    parent: u64,
    of: impl Fn(&C) -> u64,
) -> Option<(Arc<P>, Vec<Arc<C>>)> {
    let closed = parents.remove(parent)?;
    let orphans = children.remove_where(|child| of(child) == parent);
    Some((closed, orphans))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_forged_and_foreign_handles_are_refused() {
        let clients: HandleTable<&str> = HandleTable::new(Kind::Client);
        let locks: HandleTable<&str> = HandleTable::new(Kind::Lock);
        let a = clients.insert("a");
        assert_ne!(a, 0);
        assert_eq!(clients.get(a).as_deref(), Some(&"a"));
        assert!(
            locks.get(a).is_none(),
            "a client handle is not a lock handle"
        );
        assert!(clients.get(0).is_none());
        assert!(clients.get(a + 1).is_none());
        assert!(clients.remove(a).is_some());
        assert!(clients.remove(a).is_none(), "double free");
        let b = clients.insert("b");
        assert_ne!(a, b, "a reused slot gets a new generation");
        assert!(clients.get(a).is_none());
        assert_eq!(clients.get(b).as_deref(), Some(&"b"));
    }

    /// Safety item 4: a slot whose generations are used up is retired, so a released handle
    /// never comes back to life (24-bit generations wrapped after 16.7 M reuses of a slot).
    #[test]
    fn a_handle_is_never_issued_twice() {
        let locks: HandleTable<u32> = HandleTable::new(Kind::Lock);
        let first = locks.insert(0);
        assert!(locks.remove(first).is_some());
        // Fast-forward the free slot to its last generations.
        locks.lock().slots[0].generation = GENERATION_MASK - 1;
        let mut seen = vec![first];
        for i in 1..5 {
            let handle = locks.insert(i);
            assert!(!seen.contains(&handle), "handle {handle:#x} issued twice");
            seen.push(handle);
            assert!(locks.remove(handle).is_some());
        }
        let slots = locks.lock().slots.len();
        assert!(slots >= 2, "the used-up slot was retired, a new one taken");
        assert!(seen.iter().all(|h| locks.get(*h).is_none()));
    }
}
