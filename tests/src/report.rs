//! What a suite run produces: the tolerance, per-tensor errors, one result per case, and the
//! report over all cases that tests print and assert on.

use std::fmt;

use crate::tolerance::Tolerance;

/// The suite's tolerance for host kernels (see the crate docs for why 1e-4).
pub const TOLERANCE: Tolerance = Tolerance::F32_ATTENTION_VS_F64;

/// Errors of one output tensor.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TensorErr {
    /// Largest `|got - want|` (infinite when a value is non-finite where it should not be).
    pub max_abs: f64,
    /// Largest `|got - want| / (atol + rtol * |want|)`: the tensor passes when `<= 1`.
    pub worst: f64,
}

/// One named case of the suite and its outcome.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// e.g. `"dflash_overlap/gqa2/d64"` or `"bad_input/q_len"`.
    pub name: String,
    pub out: TensorErr,
    pub lse: TensorErr,
    pub dq: TensorErr,
    pub dk: TensorErr,
    pub dv: TensorErr,
    /// Why the case failed; `None` when it passed.
    pub failure: Option<String>,
    /// `false` for the malformed-input cases, which check that the kernel returns `Err`
    /// and compare no values.
    pub numeric: bool,
}

impl CaseResult {
    pub(crate) fn new(name: String) -> Self {
        CaseResult {
            name,
            out: TensorErr::default(),
            lse: TensorErr::default(),
            dq: TensorErr::default(),
            dk: TensorErr::default(),
            dv: TensorErr::default(),
            failure: None,
            numeric: true,
        }
    }
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
    fn all(&self) -> [TensorErr; 5] {
        [self.out, self.lse, self.dq, self.dk, self.dv]
    }
    /// Largest absolute error over all five outputs.
    pub fn max_err(&self) -> f64 {
        self.all().iter().map(|e| e.max_abs).fold(0.0, f64::max)
    }
    /// Largest tolerance ratio over all five outputs (`<= 1` passes).
    pub fn worst(&self) -> f64 {
        self.all().iter().map(|e| e.worst).fold(0.0, f64::max)
    }
    pub(crate) fn fail(&mut self, why: String) {
        match &mut self.failure {
            Some(f) => {
                f.push_str("; ");
                f.push_str(&why);
            }
            None => self.failure = Some(why),
        }
    }
}

impl fmt::Display for CaseResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match &self.failure {
            None => "ok".to_string(),
            Some(why) => format!("FAILED: {why}"),
        };
        if !self.numeric {
            return write!(
                f,
                "case={} (malformed input must be Err) {verdict}",
                self.name
            );
        }
        write!(
            f,
            "case={} max_err={:.3e} worst={:.3} out={:.2e} lse={:.2e} dq={:.2e} dk={:.2e} dv={:.2e} {}",
            self.name,
            self.max_err(),
            self.worst(),
            self.out.max_abs,
            self.lse.max_abs,
            self.dq.max_abs,
            self.dk.max_abs,
            self.dv.max_abs,
            verdict
        )
    }
}

/// The outcome of running the suite on one kernel.
#[derive(Debug, Clone)]
pub struct Report {
    pub kernel: String,
    pub tolerance: Tolerance,
    pub cases: Vec<CaseResult>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.cases.iter().all(CaseResult::passed)
    }
    pub fn failures(&self) -> Vec<&CaseResult> {
        self.cases.iter().filter(|c| !c.passed()).collect()
    }
    /// `Ok` when every case passed, else an error naming the kernel and each failing case.
    pub fn ensure_passed(&self) -> Result<(), String> {
        let failed = self.failures();
        if failed.is_empty() {
            return Ok(());
        }
        let lines: Vec<String> = failed
            .iter()
            .map(|c| {
                format!(
                    "kernel={} case={}: {}",
                    self.kernel,
                    c.name,
                    c.failure.as_deref().unwrap_or("")
                )
            })
            .collect();
        Err(format!(
            "attention kernel {:?} failed {} of {} conformance cases:\n{}",
            self.kernel,
            failed.len(),
            self.cases.len(),
            lines.join("\n")
        ))
    }
}

impl fmt::Display for Report {
    /// One line per case, each prefixed with `kernel=<name>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.cases {
            writeln!(f, "kernel={} {c}", self.kernel)?;
        }
        write!(
            f,
            "kernel={} {}/{} cases passed ({})",
            self.kernel,
            self.cases.len() - self.failures().len(),
            self.cases.len(),
            self.tolerance
        )
    }
}
