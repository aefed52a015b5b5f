//! The trait every `variant_space!` implements, and what a validity rule sees and answers.

use serde::Serialize;

use crate::Arch;

/// One point of a declared variant space: renderable, nameable, checkable.
/// Implemented by `variant_space!`; see [`crate::variant_space`].
pub trait Variant: Clone + Send + Sync + 'static {
    /// The space's name in snake case, e.g. `"w4a16"`.
    const SPACE: &'static str;

    /// The template file under `templates/` that renders this variant, e.g. `"w4a16_mma.cu.tera"`.
    fn template(&self) -> String;

    /// A stable, readable name, unique in the space; also the CUDA kernel's function name.
    fn name(&self) -> String;

    /// What the template sees: each axis by its name (enums as their `AxisValue` string, integers as
    /// integers) and `name`.
    fn context(&self) -> tera::Context;

    /// Every point of the space, valid or not: the cartesian product of the axes, first axis outermost.
    fn all() -> Vec<Self>;

    /// The space's validity rule: `Err` with the reason when the variant cannot run on `target`.
    fn check(&self, target: &Target) -> Result<(), Invalid>;

    /// The variant whose [`Variant::name`] is `name`.
    fn from_name(name: &str) -> Option<Self>;

    /// The points of the space that are valid on `target`, in [`Variant::all`] order.
    fn valid(target: &Target) -> Vec<Self> {
        Self::all().into_iter().filter(|v| v.check(target).is_ok()).collect()
    }
}

/// What a [`Variant`] of a space not known statically can do: render, name and check itself.
/// [`Variant`] itself cannot be a trait object (its `all` and `from_name` make values), so a trait
/// over several spaces, such as [`crate::w4a16::dense::DenseFamily`], builds on this one; every
/// [`Variant`] is one. Callers need not import it (a trait object has its methods as they are),
/// and beside [`Variant`] its methods would be ambiguous on a concrete variant.
pub trait DynVariant {
    /// [`Variant::template`].
    fn template(&self) -> String;
    /// [`Variant::name`].
    fn name(&self) -> String;
    /// [`Variant::context`].
    fn context(&self) -> tera::Context;
    /// [`Variant::check`].
    fn check(&self, target: &Target) -> Result<(), Invalid>;
}

impl<V: Variant> DynVariant for V {
    fn template(&self) -> String {
        Variant::template(self)
    }

    fn name(&self) -> String {
        Variant::name(self)
    }

    fn context(&self) -> tera::Context {
        Variant::context(self)
    }

    fn check(&self, target: &Target) -> Result<(), Invalid> {
        Variant::check(self, target)
    }
}

/// A value of an enum axis, as it reads in variant names and template contexts (`"bf16"`, `"mma"`).
/// Integer axes need no impl: the macro writes them as numbers.
pub trait AxisValue: Copy {
    fn as_str(&self) -> &'static str;
}

impl AxisValue for kdtree_quant::Dtype {
    fn as_str(&self) -> &'static str {
        self.name()
    }
}

/// What a validity rule may depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub arch: Arch,
}

/// Why a variant cannot run on a target; its `Display` is the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
pub enum Invalid {
    #[error("needs {requested} bytes of shared memory per block, the arch allows {max}")]
    SharedMemory { requested: usize, max: usize },
    #[error("{reason}")]
    Incompatible { reason: String },
}
