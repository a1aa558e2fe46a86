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

    /// Whether `lifetime` is in the live set (it has not ended, and no newer lifetime of its
    /// instance has taken its place).
    pub(crate) fn holds(&self, lifetime: &Arc<Lifetime>) -> bool {
        self.map()
            .get(&lifetime.lease.instance)
            .is_some_and(|l| Arc::ptr_eq(l, lifetime))
    }

    /// Every lifetime in memory now.
    pub(crate) fn all(&self) -> Vec<Arc<Lifetime>> {
        self.map().values().cloned().collect()
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::env::Env;
    use crate::lifetime::Abort;

    fn lifetime(env: &Arc<Env>, epoch: u64) -> Arc<Lifetime> {
        Arc::new(Lifetime::for_tests(env, epoch))
    }

    /// A newer lease of the same instance stops the older lifetime at once (it is fenced
    /// off) and takes its place; an older one arriving late never displaces a newer one.
    #[tokio::test]
    async fn a_newer_lifetime_stops_the_older_one_and_is_never_displaced() {
        let dir = tempfile::tempdir().unwrap();
        let env = Env::for_tests(dir.path());
        let live = Live::default();
        let (older, newer) = (lifetime(&env, 1), lifetime(&env, 2));
        let _older_entry = live.enter(&older);
        let _newer_entry = live.enter(&newer);
        let aborted = tokio::time::timeout(Duration::from_secs(1), older.aborted()).await;
        assert!(
            matches!(aborted, Ok(Abort::Stopped)),
            "the fenced lifetime is stopped"
        );
        assert!(Arc::ptr_eq(&live.get(InstanceRef(7)).unwrap(), &newer));
        let late = lifetime(&env, 1);
        let _late_entry = live.enter(&late);
        assert!(
            Arc::ptr_eq(&live.get(InstanceRef(7)).unwrap(), &newer),
            "never displaced"
        );
        assert!(
            live.fenced_by(InstanceRef(7), 1).is_none(),
            "a transition of epoch 1 spares it"
        );
    }
}
