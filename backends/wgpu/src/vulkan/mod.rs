//! What needs the Vulkan API below wgpu (through `ash`, the version wgpu-hal uses): the device
//! memory the job's memory plan is checked against ([`memory`]), and two measurement switches,
//! both off by default:
//!
//! - `DFLASH_WGPU_ROBUSTNESS=off` opens the device without robust buffer access, to time what
//!   the driver's own bounds checks cost the kernels ([`open`]);
//! - `DFLASH_WGPU_PIPELINE_STATS=1` (or `=DIR`) prints what the driver's compiler made of each
//!   pipeline the backend creates: registers, spills, shared memory, instruction counts, as far
//!   as the driver reports them through `VK_KHR_pipeline_executable_properties` ([`stats`];
//!   with a directory, its internal representations are written there too).
//!
//! Either switch makes the backend create its Vulkan device by hand (the extensions and features
//! wgpu asks for, then the switch's change) and hand it to wgpu.

pub(crate) mod memory;
pub(crate) mod open;
pub(crate) mod stats;

/// What the device must be opened with, from the switches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct HandOpen {
    /// Without robust buffer access (`DFLASH_WGPU_ROBUSTNESS=off`).
    pub unrobust: bool,
    /// With `VK_KHR_pipeline_executable_properties` (`DFLASH_WGPU_PIPELINE_STATS`).
    pub executable_properties: bool,
}

impl HandOpen {
    /// The switches of this process.
    pub(crate) fn from_env() -> Self {
        HandOpen {
            unrobust: open::disabled(),
            executable_properties: stats::wanted().is_some(),
        }
    }

    /// Whether wgpu's own `request_device` will not do.
    pub(crate) fn needed(self) -> bool {
        self.unrobust || self.executable_properties
    }
}
