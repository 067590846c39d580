//! A plugin without a backward, as a whole kernel for the suite: its own forward and the
//! reference kernel's backward (f64 sums, far inside the suite's tolerance), so each case's
//! verdict is the plugin's forward alone.

use dflash_attention_loader::PluginKernel;
use dflash_backend_reference::ReferenceAttention;
use dflash_core::{AttnBackward, AttnForward, HostAttentionKernel};

pub(crate) struct ForwardOnly<'a>(pub(crate) &'a PluginKernel);

impl HostAttentionKernel for ForwardOnly<'_> {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn forward(&self, call: AttnForward<'_>) -> Result<(), String> {
        self.0.forward(call)
    }
    fn backward(&self, call: AttnBackward<'_>) -> Result<(), String> {
        ReferenceAttention.backward(call)
    }
}
