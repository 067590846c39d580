//! `dflash-plugin-conformance PATH`: the conformance table of the plugin at `PATH`; exits
//! non-zero when any case fails or the plugin cannot be loaded.

use std::process::ExitCode;

use dflash_attention_loader::PluginKernel;
use dflash_plugin_conformance::check_plugin;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path] = args.as_slice() else {
        eprintln!("usage: dflash-plugin-conformance PATH/TO/libplugin.so");
        return ExitCode::from(2);
    };
    let kernel = match PluginKernel::load(path) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match check_plugin(&kernel) {
        Ok(table) => {
            println!("{table}");
            if table.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("conformance could not run: {e}");
            ExitCode::FAILURE
        }
    }
}
