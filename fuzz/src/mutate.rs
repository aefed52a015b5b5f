//! Hostile edits of input files: JSON documents (keys removed, values replaced by huge, negative,
//! tiny, wrongly typed ones) and raw bytes (truncated, flipped, extended).

use std::collections::BTreeSet;

use proptest::prelude::*;
use serde_json::{Value, json};

/// A position in something whose length is known only when an edit is applied: `n % len`.
#[derive(Clone, Copy, Debug)]
pub struct At(pub usize);

impl At {
    fn of(self, len: usize) -> usize {
        self.0 % len.max(1)
    }
}

fn at() -> impl Strategy<Value = At> {
    any::<usize>().prop_map(At)
}

/// One edit of a JSON document. [`At`] picks a value among all of the document's values (nested
/// ones included) when the edit is applied, so that edits compose.
#[derive(Clone, Debug)]
pub enum Edit {
    Remove(At),
    Replace(At, Value),
}

/// The path of one value: object keys and array positions.
type Path = Vec<Step>;

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    At(usize),
}

/// Every value's path in `doc`, the root excluded, parents before children.
fn paths(doc: &Value) -> Vec<Path> {
    fn walk(v: &Value, here: &mut Path, out: &mut Vec<Path>) {
        let children: Vec<(Step, &Value)> = match v {
            Value::Object(map) => map.iter().map(|(k, v)| (Step::Key(k.clone()), v)).collect(),
            Value::Array(items) => items.iter().enumerate().map(|(i, v)| (Step::At(i), v)).collect(),
            _ => Vec::new(),
        };
        for (step, child) in children {
            here.push(step);
            out.push(here.clone());
            walk(child, here, out);
            here.pop();
        }
    }
    let mut out = Vec::new();
    walk(doc, &mut Vec::new(), &mut out);
    out
}

/// The parent of `path` and the last step, if the path still leads somewhere.
fn parent<'a>(doc: &'a mut Value, path: &[Step]) -> Option<(&'a mut Value, Step)> {
    let (last, init) = path.split_last()?;
    let mut v = doc;
    for step in init {
        v = match (v, step) {
            (Value::Object(map), Step::Key(k)) => map.get_mut(k)?,
            (Value::Array(items), Step::At(i)) => items.get_mut(*i)?,
            _ => return None,
        };
    }
    Some((v, last.clone()))
}

impl Edit {
    /// Applies the edit; returns the object keys on the path of the value it edited
    /// (`["rope_scaling", "factor"]`), which an error about the edit should name.
    pub fn apply(&self, doc: &mut Value) -> Vec<String> {
        let all = paths(doc);
        if all.is_empty() {
            return Vec::new();
        }
        let (index, replacement) = match self {
            Edit::Remove(i) => (i, None),
            Edit::Replace(i, v) => (i, Some(v)),
        };
        let path = &all[index.of(all.len())];
        let keys =
            path.iter().filter_map(|step| if let Step::Key(k) = step { Some(k.clone()) } else { None }).collect();
        let Some((parent, last)) = parent(doc, path) else { return keys };
        match (parent, last, replacement) {
            (Value::Object(map), Step::Key(k), None) => {
                map.remove(&k);
            }
            (Value::Array(items), Step::At(i), None) => {
                items.remove(i);
            }
            (Value::Object(map), Step::Key(k), Some(v)) => {
                map.insert(k, v.clone());
            }
            (Value::Array(items), Step::At(i), Some(v)) => items[i] = v.clone(),
            _ => {}
        }
        keys
    }
}

/// Values chosen to break sizes and arithmetic: zero, one-off, huge and negative integers, floats
/// that are zero, tiny, beyond f32 or negative, strings, null and the wrong container types.
pub fn hostile_value() -> impl Strategy<Value = Value> {
    let ints: Vec<Value> =
        [0u64, 1, 2, 3, 7, 8, 31, 33, 255, 256, 1 << 16, 1 << 26, 1 << 32, 1 << 40, 1 << 62, u64::MAX]
            .into_iter()
            .map(Value::from)
            .chain([-1i64, -8, i64::from(i32::MIN), i64::MIN].into_iter().map(Value::from))
            .collect();
    let floats: Vec<Value> =
        [0.0, -0.0, -1.0, 0.5, 1.0, 1e-50, 1e-300, 1e39, 1e308, -1e308, 3.5].into_iter().map(Value::from).collect();
    let others = vec![
        json!(""),
        json!("yarn"),
        json!("default"),
        json!("re:("),
        json!("re:.*"),
        json!("../x.safetensors"),
        json!(null),
        json!(true),
        json!([]),
        json!({}),
        json!([1, 2]),
        json!({"type": "yarn"}),
    ];
    prop_oneof![
        4 => prop::sample::select(ints),
        3 => prop::sample::select(floats),
        2 => prop::sample::select(others),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<f64>().prop_filter("JSON numbers are finite", |x| x.is_finite()).prop_map(Value::from),
    ]
}

/// One to four edits.
pub fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        1 => at().prop_map(Edit::Remove),
        3 => (at(), hostile_value()).prop_map(|(i, v)| Edit::Replace(i, v)),
    ];
    prop::collection::vec(edit, 1..=4)
}

/// `doc` with `edits` applied.
pub fn edited(doc: &Value, edits: &[Edit]) -> Value {
    edited_keys(doc, edits).0
}

/// `doc` with `edits` applied, and every key on the paths of the values edited.
pub fn edited_keys(doc: &Value, edits: &[Edit]) -> (Value, BTreeSet<String>) {
    let mut doc = doc.clone();
    let keys = edits.iter().flat_map(|e| e.apply(&mut doc)).collect();
    (doc, keys)
}

/// One edit of a byte string.
#[derive(Clone, Debug)]
pub enum ByteEdit {
    Truncate(At),
    Flip(At, u8),
    Overwrite(At, Vec<u8>),
    Append(Vec<u8>),
}

impl ByteEdit {
    pub fn apply(&self, bytes: &mut Vec<u8>) {
        let len = bytes.len();
        match self {
            ByteEdit::Truncate(i) => bytes.truncate(i.of(len)),
            ByteEdit::Flip(i, mask) if len > 0 => bytes[i.of(len)] ^= (*mask).max(1),
            ByteEdit::Overwrite(i, with) if len > 0 => {
                let at = i.of(len);
                let end = (at + with.len()).min(len);
                bytes[at..end].copy_from_slice(&with[..end - at]);
            }
            ByteEdit::Append(more) => bytes.extend_from_slice(more),
            _ => {}
        }
    }
}

/// One to three byte edits.
pub fn byte_edits() -> impl Strategy<Value = Vec<ByteEdit>> {
    let edit = prop_oneof![
        at().prop_map(ByteEdit::Truncate),
        (at(), any::<u8>()).prop_map(|(i, m)| ByteEdit::Flip(i, m)),
        (at(), prop::collection::vec(any::<u8>(), 1..9)).prop_map(|(i, b)| ByteEdit::Overwrite(i, b)),
        prop::collection::vec(any::<u8>(), 1..64).prop_map(ByteEdit::Append),
    ];
    prop::collection::vec(edit, 1..=3)
}

/// Cases per suite: `PROPTEST_CASES` when set (a long pass), else `ci` (the bounded pass).
pub fn cases(ci: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(ci)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_reach_nested_values_and_compose() {
        let doc = json!({"a": 1, "b": {"c": [1, 2]}});
        assert_eq!(paths(&doc).len(), 5);
        let removed = edited(&doc, &[Edit::Remove(At(4))]);
        assert_eq!(paths(&removed).len(), 4, "{removed}");
        let (replaced, keys) = edited_keys(&doc, &[Edit::Replace(At(0), json!("x")), Edit::Remove(At(3))]);
        assert_eq!(replaced["a"], "x");
        // The array element's path names the keys above it.
        assert_eq!(keys, BTreeSet::from(["a".to_owned(), "b".to_owned(), "c".to_owned()]));
    }
}
