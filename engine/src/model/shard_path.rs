//! Where the shard names of `model.safetensors.index.json` may point: inside the model folder.

use std::path::{Component, Path, PathBuf};

use crate::error::{EngineError, Result};

/// The path of the shard `name` (a `weight_map` value of the index) in the model folder `dir`.
///
/// `name` must be a relative path that stays inside `dir`: an absolute path, a drive prefix or a `..`
/// component is [`EngineError::ShardOutsideModel`], naming the index and the shard, so that an index
/// cannot make the engine read files elsewhere. The check is on the name, not on where links lead:
/// Hugging Face's cache keeps a snapshot's files as links into the `blobs/` folder beside it, and
/// such folders must keep loading.
pub(crate) fn shard_path(dir: &Path, name: &str) -> Result<PathBuf> {
    let refuse = |reason| EngineError::ShardOutsideModel {
        index: dir.join("model.safetensors.index.json").display().to_string(),
        shard: name.into(),
        reason,
    };
    let mut path = dir.to_path_buf();
    let mut named = false;
    for component in Path::new(name).components() {
        match component {
            Component::Normal(part) => {
                path.push(part);
                named = true;
            }
            Component::CurDir => {}
            Component::ParentDir => return Err(refuse("climbs out of the model folder (`..`)")),
            Component::RootDir | Component::Prefix(_) => return Err(refuse("is an absolute path")),
        }
    }
    if named { Ok(path) } else { Err(refuse("names no file")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_inside_the_folder_resolve_there() {
        let dir = Path::new("/models/k2");
        assert_eq!(
            shard_path(dir, "model-00001-of-00002.safetensors").unwrap(),
            dir.join("model-00001-of-00002.safetensors")
        );
        assert_eq!(shard_path(dir, "./sub/a.safetensors").unwrap(), dir.join("sub").join("a.safetensors"));
    }

    #[test]
    fn names_that_leave_the_folder_are_refused_naming_index_and_shard() {
        let dir = Path::new("models/k2");
        for (name, why) in [
            ("../elsewhere.safetensors", "`..`"),
            ("sub/../../x.safetensors", "`..`"),
            ("a/../b.safetensors", "`..`"),
            ("/etc/passwd", "absolute"),
            ("", "names no file"),
            (".", "names no file"),
        ] {
            let e = shard_path(dir, name).unwrap_err();
            let m = e.to_string();
            assert!(matches!(&e, EngineError::ShardOutsideModel { shard, .. } if shard == name), "{m}");
            assert!(m.contains("models/k2/model.safetensors.index.json") && m.contains(why), "{name}: {m}");
        }
    }
}
