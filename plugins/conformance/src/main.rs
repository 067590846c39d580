//! `dflash-plugin-conformance PATH`: the conformance table of the plugin at `PATH` (a CUDA
//! plugin through the CUDA backend, a CPU plugin through the loader's host calls); exits
//! non-zero when any case fails or the plugin cannot be loaded.

use std::process::ExitCode;

use dflash_attention_loader::{Plugin, PluginKernel};
use dflash_plugin_conformance::{Table, check_device_plugin, check_plugin};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path] = args.as_slice() else {
        eprintln!("usage: dflash-plugin-conformance PATH/TO/libplugin.so");
        return ExitCode::from(2);
    };
    let run = |path: &str| -> Result<Table, String> {
        let plugin = Plugin::load(path).map_err(|e| e.to_string())?;
        if plugin.capabilities().device_type == dflash_attention_abi::kDLCUDA {
            drop(plugin);
            return check_device_plugin(path.as_ref());
        }
        let kernel = PluginKernel::new(std::sync::Arc::new(plugin)).map_err(|e| e.to_string())?;
        check_plugin(&kernel)
    };
    match run(path) {
        Ok(table) => {
            println!("{table}");
            if table.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("conformance could not run on {path}: {e}");
            ExitCode::FAILURE
        }
    }
}
