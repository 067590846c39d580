//! `DFLASH_WGPU_PIPELINE_STATS=1` (or `=DIR`): what the driver's compiler made of each
//! pipeline, through `VK_KHR_pipeline_executable_properties`.
//!
//! wgpu creates its pipelines without `VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR`, so each
//! pipeline the backend creates is compiled a second time here, by the same driver on the same
//! device: the module's WGSL through naga to SPIR-V with options close to wgpu's (SPIR-V 1.3,
//! the module's runtime checks on naga's index accesses, buffer bounds left to the driver,
//! workgroup memory not zeroed, its overridable constants), then a compute pipeline with the
//! capture flags, whose statistics (registers, spills, shared memory, instruction counts: what
//! the driver chooses to report) are printed to stderr, one line per executable. With a
//! directory instead of `1`, each pipeline's statistics and internal representations (what the
//! driver chooses to show: IR, assembly) are written there too, one file per pipeline.
//! A measurement aid: it says what the compiler did, not how fast the result runs.

use std::ffi::CStr;
use std::fmt::Write as _;
use std::path::PathBuf;

use ash::vk;
use wgpu::hal::api::Vulkan;

/// The switch: `None` when off; `Some(None)` to print, `Some(Some(dir))` to print and write.
pub(crate) fn wanted() -> Option<Option<PathBuf>> {
    let v = std::env::var("DFLASH_WGPU_PIPELINE_STATS").ok()?;
    match v.as_str() {
        "" | "0" | "off" => None,
        "1" | "on" => Some(None),
        dir => Some(Some(PathBuf::from(dir))),
    }
}

/// One pipeline to report: the module's WGSL, its entry point and constants, and the checks
/// it was compiled with.
pub(crate) struct Report<'a> {
    pub label: &'a str,
    pub source: &'a str,
    pub entry: &'a str,
    pub consts: &'a [(&'static str, f64)],
    pub checks: wgpu::ShaderRuntimeChecks,
}

/// Prints (and, with a directory, writes) `r`'s statistics; a failure is printed, never fatal.
pub(crate) fn report(device: &wgpu::Device, r: &Report<'_>) {
    let name = format!("{} {} {:?}", r.label, r.entry, r.consts);
    match capture(device, r) {
        Ok(Described { stats, text }) => {
            for line in stats {
                eprintln!("dflash-backend-wgpu: pipeline stats: {name}: {line}");
            }
            if let Some(Some(dir)) = wanted() {
                let file = dir.join(file_name(&name));
                let written = std::fs::create_dir_all(&dir)
                    .and_then(|()| std::fs::write(&file, format!("{name}\n{text}")));
                if let Err(e) = written {
                    eprintln!(
                        "dflash-backend-wgpu: pipeline stats: {}: {e}",
                        file.display()
                    );
                }
            }
        }
        Err(e) => eprintln!("dflash-backend-wgpu: pipeline stats: {name}: not available: {e}"),
    }
}

/// A file name for a pipeline: its description with everything but `[A-Za-z0-9._-]` as `_`.
fn file_name(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{s}.txt")
}

/// The SPIR-V of `r`'s entry point, with options close to wgpu's (see the module docs).
pub(crate) fn spirv(r: &Report<'_>) -> Result<Vec<u32>, String> {
    use naga::back::spv;
    use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
    let module = naga::front::wgsl::parse_str(r.source).map_err(|e| e.emit_to_string(r.source))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| e.emit_to_string(r.source))?;
    let consts: naga::back::PipelineConstants =
        r.consts.iter().map(|&(k, v)| (k.to_string(), v)).collect();
    let stage = naga::ShaderStage::Compute;
    let (module, info) = naga::back::pipeline_constants::process_overrides(
        &module,
        &info,
        Some((stage, r.entry)),
        &consts,
    )
    .map_err(|e| format!("overridable constants: {e}"))?;
    let index = match r.checks.bounds_checks {
        true => BoundsCheckPolicy::Restrict,
        false => BoundsCheckPolicy::Unchecked,
    };
    let options = spv::Options {
        lang_version: (1, 3),
        flags: spv::WriterFlags::empty(),
        bounds_check_policies: BoundsCheckPolicies {
            index,
            buffer: BoundsCheckPolicy::Unchecked,
            image_load: BoundsCheckPolicy::Unchecked,
            binding_array: BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: r.checks.force_loop_bounding,
        emit_int_div_checks: r.checks.bounds_checks,
        use_storage_input_output_16: false,
        ..spv::Options::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: stage,
        entry_point: r.entry.to_string(),
    };
    spv::write_vec(&module, &info, &options, Some(&pipeline)).map_err(|e| format!("SPIR-V: {e}"))
}

/// `(binding, uniform?)` of every group-0 resource the module declares.
fn bindings_of(source: &str) -> Result<Vec<(u32, bool)>, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let mut out = Vec::new();
    for (_, g) in module.global_variables.iter() {
        if let Some(b) = &g.binding {
            out.push((b.binding, g.space == naga::AddressSpace::Uniform));
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// What the driver reported of a pipeline: one line per executable and statistic, and the
/// whole report with its internal representations.
struct Described {
    stats: Vec<String>,
    text: String,
}

/// Compiles `r` on `device` with the capture flags and renders what the driver reports.
fn capture(device: &wgpu::Device, r: &Report<'_>) -> Result<Described, String> {
    let words = spirv(r)?;
    let bindings = bindings_of(r.source)?;
    // SAFETY: every handle made here is made on the device's own raw handle and destroyed
    // before returning; the queries only read the pipeline they are given.
    unsafe {
        let hal = device.as_hal::<Vulkan>().ok_or("not a Vulkan device")?;
        let raw = hal.raw_device();
        let instance = hal.shared_instance().raw_instance();
        let props = ash::khr::pipeline_executable_properties::Device::new(instance, raw);
        let module = raw
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
            .map_err(|e| format!("vkCreateShaderModule: {e}"))?;
        let entries: Vec<_> = bindings
            .iter()
            .map(|&(b, uniform)| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(match uniform {
                        true => vk::DescriptorType::UNIFORM_BUFFER,
                        false => vk::DescriptorType::STORAGE_BUFFER,
                    })
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let set_layout = raw.create_descriptor_set_layout(
            &vk::DescriptorSetLayoutCreateInfo::default().bindings(&entries),
            None,
        );
        let made = set_layout.map_err(|e| format!("vkCreateDescriptorSetLayout: {e}"));
        let result = made.and_then(|set_layout| {
            let layouts = [set_layout];
            let pl = raw.create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts),
                None,
            );
            let out = pl
                .map_err(|e| format!("vkCreatePipelineLayout: {e}"))
                .and_then(|pl| {
                    let out = compile_and_query(raw, &props, module, pl, r.entry);
                    raw.destroy_pipeline_layout(pl, None);
                    out
                });
            raw.destroy_descriptor_set_layout(set_layout, None);
            out
        });
        raw.destroy_shader_module(module, None);
        result
    }
}

/// The capturing pipeline of `entry`, its executables' statistics and internal
/// representations, the pipeline destroyed.
///
/// # Safety
/// `module` and `layout` must be valid handles of `raw`.
unsafe fn compile_and_query(
    raw: &ash::Device,
    props: &ash::khr::pipeline_executable_properties::Device,
    module: vk::ShaderModule,
    layout: vk::PipelineLayout,
    entry: &str,
) -> Result<Described, String> {
    let entry_c = std::ffi::CString::new(entry).map_err(|e| e.to_string())?;
    let stage = vk::PipelineShaderStageCreateInfo::default()
        .stage(vk::ShaderStageFlags::COMPUTE)
        .module(module)
        .name(&entry_c);
    let info = vk::ComputePipelineCreateInfo::default()
        .flags(
            vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR,
        )
        .stage(stage)
        .layout(layout);
    // SAFETY: the create info's handles are valid (the caller's promise).
    let pipelines = unsafe {
        raw.create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
            .map_err(|(_, e)| format!("vkCreateComputePipelines: {e}"))?
    };
    let pipeline = pipelines[0];
    // SAFETY: `pipeline` was made just above on `raw` with the capture flags.
    let out = unsafe { describe(props, pipeline) };
    // SAFETY: nothing uses the pipeline after this.
    unsafe { raw.destroy_pipeline(pipeline, None) };
    out
}

/// Every executable of `pipeline`: its name and subgroup size, its statistics, then its
/// internal representations.
///
/// # Safety
/// `pipeline` must have been created with the capture flags on `props`'s device.
unsafe fn describe(
    props: &ash::khr::pipeline_executable_properties::Device,
    pipeline: vk::Pipeline,
) -> Result<Described, String> {
    let info = vk::PipelineInfoKHR::default().pipeline(pipeline);
    // SAFETY: as the caller promises.
    let executables = unsafe { props.get_pipeline_executable_properties(&info) }
        .map_err(|e| format!("vkGetPipelineExecutablePropertiesKHR: {e}"))?;
    let mut text = String::new();
    let mut lines = Vec::new();
    for (i, exe) in executables.iter().enumerate() {
        let exe_info = vk::PipelineExecutableInfoKHR::default()
            .pipeline(pipeline)
            .executable_index(i as u32);
        let head = format!(
            "executable {i}: {} ({}), subgroup size {}",
            c_str(&exe.name),
            c_str(&exe.description),
            exe.subgroup_size
        );
        let _ = writeln!(text, "{head}");
        lines.push(head);
        // SAFETY: as the caller promises; `exe_info` names one of its executables.
        let stats = unsafe { props.get_pipeline_executable_statistics(&exe_info) }
            .map_err(|e| format!("vkGetPipelineExecutableStatisticsKHR: {e}"))?;
        for s in &stats {
            // SAFETY: `format` says which member of the value union the driver wrote.
            let value = unsafe {
                match s.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => {
                        (s.value.b32 != 0).to_string()
                    }
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => s.value.f64.to_string(),
                    _ => "?".into(),
                }
            };
            let line = format!("[{i}] {} = {value}", c_str(&s.name));
            let _ = writeln!(text, "  {line}");
            lines.push(line);
        }
        // SAFETY: as above.
        for (name, body) in unsafe { internal_representations(props, &exe_info) } {
            let _ = writeln!(text, "-- [{i}] internal representation: {name}\n{body}");
        }
    }
    Ok(Described { stats: lines, text })
}

/// The executable's internal representations as `(name, text)`; binary ones by their size.
/// Empty where the driver offers none or the query fails.
///
/// # Safety
/// `info` must name an executable of a pipeline made with the capture flags on `props`'s
/// device.
unsafe fn internal_representations(
    props: &ash::khr::pipeline_executable_properties::Device,
    info: &vk::PipelineExecutableInfoKHR<'_>,
) -> Vec<(String, String)> {
    // SAFETY: as the caller promises. The first call reports each one's size (no data), the
    // second fills buffers of those sizes.
    unsafe {
        let Ok(mut reps) = props.get_pipeline_executable_internal_representations(info) else {
            return Vec::new();
        };
        let mut buffers: Vec<Vec<u8>> = reps.iter().map(|r| vec![0u8; r.data_size]).collect();
        for (r, b) in reps.iter_mut().zip(buffers.iter_mut()) {
            r.p_data = b.as_mut_ptr().cast();
        }
        let mut count = reps.len() as u32;
        let fill = (props
            .fp()
            .get_pipeline_executable_internal_representations_khr)(
            props.device(),
            info,
            &mut count,
            reps.as_mut_ptr(),
        );
        if fill != vk::Result::SUCCESS && fill != vk::Result::INCOMPLETE {
            return Vec::new();
        }
        reps.iter()
            .zip(&buffers)
            .take(count as usize)
            .map(|(r, b)| {
                let body = match r.is_text != 0 {
                    true => String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or(&[]))
                        .into_owned(),
                    false => format!("({} bytes of binary data)", r.data_size),
                };
                (c_str(&r.name), body)
            })
            .collect()
    }
}

/// A fixed-size, NUL-terminated C string field as text.
fn c_str(chars: &[std::ffi::c_char]) -> String {
    // SAFETY: c_char and u8 have the same size; the slice is read up to its length only.
    let bytes: &[u8] = unsafe { std::slice::from_raw_parts(chars.as_ptr().cast(), chars.len()) };
    CStr::from_bytes_until_nul(bytes)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}
