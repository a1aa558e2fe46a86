//! The live set: the lifetimes in memory now, by instance (hibernated instances are not
//! here). Management calls reach a running lifetime through it (abort it, tell it of a pause
//! or an event); a lifetime is in it from before its first await until it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cairn_store::InstanceRef;

use crate::lifetime::Lifetime;

#[derive(Default)]
pub(crate) struct Live(Mutex<HashMap<InstanceRef, Arc<Lifetime>>>);

impl Live {
    fn map(&self) -> MutexGuard<'_, HashMap<InstanceRef, Arc<Lifetime>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds `lifetime`, unless a newer lifetime of the same instance (a later lease, whose
    /// driver started first) is there: the newer one keeps its in-memory aborts and nudges.
    pub(crate) fn enter(&self, lifetime: &Arc<Lifetime>) -> LiveEntry<'_> {
        let instance = lifetime.lease.instance;
        let mut map = self.map();
        match map.get(&instance) {
            Some(other) if other.lease.epoch > lifetime.lease.epoch => {}
            other => {
                // An older lifetime still here is fenced off (this newer claim proves it):
                // stop it now, not at its next commit, so its step body does not run on
                // beside ours.
                if let Some(older) = other.filter(|o| !Arc::ptr_eq(o, lifetime)) {
                    older.abort(crate::lifetime::Abort::Stopped);
                }
                map.insert(instance, Arc::clone(lifetime));
            }
        }
        LiveEntry {
            live: self,
            lifetime: Arc::clone(lifetime),
        }
    }

    /// The lifetime of `instance` in memory now.
    pub(crate) fn get(&self, instance: InstanceRef) -> Option<Arc<Lifetime>> {
        self.map().get(&instance).cloned()
    }

    /// The lifetime of `instance` if it holds a lease of `epoch` or older: the one a
    /// transition that fenced `epoch` concerns, never one claimed after it.
    pub(crate) fn fenced_by(&self, instance: InstanceRef, epoch: u64) -> Option<Arc<Lifetime>> {
        self.get(instance).filter(|s| s.lease.epoch <= epoch)
    }

    /// How many lifetimes are in memory.
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }
}

/// A lifetime's place in the live set, given back when dropped.
pub(crate) struct LiveEntry<'a> {
    live: &'a Live,
    lifetime: Arc<Lifetime>,
}

impl Drop for LiveEntry<'_> {
    fn drop(&mut self) {
        let instance = self.lifetime.lease.instance;
        let mut map = self.live.map();
        // A restarted instance may already have a new lifetime: remove only our own entry.
        if map
            .get(&instance)
            .is_some_and(|s| Arc::ptr_eq(s, &self.lifetime))
        {
            map.remove(&instance);
        }
    }
}
