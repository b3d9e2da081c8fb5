//! Lookups by another indexer's hashes: a key of aliases (`crate::aliases`)
//! translated into our key, read from the trees under a reader's pin.

use crate::aliases::continued;
use crate::index::Reader;

impl Reader<'_> {
    /// Our key of `names`, a key of aliases (see the module docs) of
    /// `model`'s engine blocks: each alias's blocks of ours in turn, up to
    /// the first alias not known (a key of engine blocks nobody holds, or
    /// never named so, matches from there on nothing anyway). At most
    /// `max_key_blocks` blocks of ours.
    pub fn translate(&self, model: &str, names: &[u64]) -> Vec<u64> {
        self.translate_counted(model, names, &mut Vec::new())
    }

    /// As [`Reader::translate`], also filling `widths` with how many of
    /// our blocks each alias translated stands for (an engine block of
    /// several of ours stands for several): what turns a match in our
    /// blocks back into engine blocks.
    pub fn translate_counted(&self, model: &str, names: &[u64], widths: &mut Vec<u32>) -> Vec<u64> {
        widths.clear();
        let index = self.index();
        let pin = self.pin();
        let mut key = Vec::new();
        let Some(tree) = index.models(pin).get(model) else {
            return key;
        };
        let max = index.config().max_key_blocks;
        'names: for &name in names {
            let Some(first) = tree.aliases.get(name, pin).filter(|f| f.width > 0) else {
                break;
            };
            let at = key.len();
            key.push(first.ours);
            for k in 1..first.width {
                match tree.aliases.get(continued(name, k), pin) {
                    Some(f) if f.width == 0 => key.push(f.ours),
                    _ => {
                        key.truncate(at);
                        break 'names;
                    }
                }
            }
            widths.push(first.width);
            if key.len() >= max {
                key.truncate(max);
                break;
            }
        }
        key
    }

    /// The models whose aliases name `name` as an engine block's, by name:
    /// where a key of aliases that starts with it is looked up when its
    /// model is not known (an adapter's blocks are a model of their own).
    pub fn alias_models(&self, name: u64) -> Vec<&str> {
        let pin = self.pin();
        let mut found: Vec<&str> = self
            .index()
            .models(pin)
            .iter()
            .filter(|(_, tree)| tree.aliases.get(name, pin).is_some_and(|f| f.width > 0))
            .map(|(model, _)| &**model)
            .collect();
        found.sort_unstable();
        found
    }
}
