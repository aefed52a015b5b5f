//! What every family's launch checks and sets before it enqueues: that a function is its variant's,
//! that the buffers hold what the kernel indexes, and the shared-memory opt-in.

use cudarc::driver::CudaFunction;
use cudarc::driver::sys::CUfunction_attribute;

use crate::{Error, Result, sys};

/// The most shared memory, static and dynamic together, a launch may use without opting in.
const DEFAULT_SMEM: usize = 48 * 1024;

/// `Ok` when `function`'s name (which the templates make the variant's) is `variant`'s:
/// [`Error::WrongKernel`] otherwise.
pub(crate) fn check_name(variant: String, function: &CudaFunction) -> Result<()> {
    match sys::function_name(function)? {
        Some(name) if name == variant => Ok(()),
        Some(name) => Err(Error::WrongKernel { variant, function: name }),
        None => Err(Error::Unsupported {
            variant,
            reason: "the CUDA driver is older than 12.3 and cannot name a loaded function, so it cannot be \
                     checked to be this variant's"
                .into(),
        }),
    }
}

/// The first buffer of `needs` (name, elements held, elements needed) that holds too few, said as an
/// error's reason.
pub(crate) fn short_buffer(needs: &[(&str, usize, usize)]) -> Option<String> {
    let (name, have, need) = needs.iter().find(|(_, have, need)| have < need)?;
    Some(format!("{name} holds {have} elements, {need} needed"))
}

/// Lets `f` launch with `smem` bytes of dynamic shared memory (and `static_smem` of its own),
/// opting in where the total is above what every launch may use.
pub(crate) fn allow_shared(f: &CudaFunction, smem: usize, static_smem: usize) -> Result<()> {
    if smem + static_smem > DEFAULT_SMEM {
        f.set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_short_buffer_is_named() {
        assert_eq!(
            short_buffer(&[("x", 4, 4), ("y", 2, 3), ("z", 0, 9)]).as_deref(),
            Some("y holds 2 elements, 3 needed")
        );
        assert_eq!(short_buffer(&[("x", 5, 4)]), None);
    }
}
