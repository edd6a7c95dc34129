//! A table of values under stable `u32` keys that reuses freed keys: the handles behind
//! [`crate::Allocation`] and the caching policy's blocks and segments. One definition
//! for every policy, with its own bookkeeping check.

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value` and returns its key (a freed key if there is one).
    pub(crate) fn insert(&mut self, value: T) -> u32 {
        match self.free.pop() {
            Some(key) => {
                self.items[key as usize] = Some(value);
                key
            }
            None => {
                self.items.push(Some(value));
                u32::try_from(self.items.len() - 1).expect("more than 4 billion live entries")
            }
        }
    }

    /// Takes the value out; its key becomes free. `None` if the key holds nothing.
    pub(crate) fn remove(&mut self, key: u32) -> Option<T> {
        let value = self.items.get_mut(key as usize)?.take()?;
        self.free.push(key);
        Some(value)
    }

    /// Takes the value out if it satisfies `keep_out` (e.g. "is this tenant").
    pub(crate) fn take_if(&mut self, key: u32, keep_out: impl FnOnce(&T) -> bool) -> Option<T> {
        let value = self.items.get_mut(key as usize)?.take_if(|v| keep_out(v))?;
        self.free.push(key);
        Some(value)
    }

    /// The value under `key`, if any.
    pub(crate) fn get(&self, key: u32) -> Option<&T> {
        self.items.get(key as usize)?.as_ref()
    }

    /// The value under `key`, if any, mutably.
    pub(crate) fn get_mut(&mut self, key: u32) -> Option<&mut T> {
        self.items.get_mut(key as usize)?.as_mut()
    }

    /// Live entries with their keys, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.items
            .iter()
            .enumerate()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k as u32, v)))
    }

    /// Live values, in key order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.items.iter().flatten()
    }

    /// Panics if the free list and the table disagree (`what` names the owner).
    pub(crate) fn check(&self, what: &str) {
        let live = self.items.iter().filter(|v| v.is_some()).count();
        assert_eq!(
            live + self.free.len(),
            self.items.len(),
            "{what}: slot bookkeeping"
        );
        assert!(
            self.free.iter().all(|&k| self.items[k as usize].is_none()),
            "{what}: a free slot holds a value"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys are stable, freed keys are reused, and the counts stay consistent.
    #[test]
    fn keys_are_stable_and_reused() {
        let mut s = Slab::default();
        let a = s.insert("a");
        let b = s.insert("b");
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.remove(a), None);
        let c = s.insert("c");
        assert_eq!(c, a, "freed key reused");
        assert_eq!(
            (s.get(b), s.get(c), s.values().count()),
            (Some(&"b"), Some(&"c"), 2)
        );
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(a, &"c"), (b, &"b")]);
        s.check("test");
    }
}
