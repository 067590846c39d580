//! The conformance table: one row per case, printed and asserted on.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Passed,
    /// Outside the plugin's declared capabilities (why).
    Skipped(String),
    Failed(String),
}

#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    /// Largest error / tolerance ratio (numeric cases).
    pub worst: Option<f64>,
    pub max_err: Option<f64>,
    pub outcome: Outcome,
}

#[derive(Debug, Clone)]
pub struct Table {
    pub plugin: String,
    pub tolerance: String,
    pub rows: Vec<Row>,
}

impl Table {
    pub fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.rows.iter().filter(|r| f(&r.outcome)).count()
    }
    pub fn failed(&self) -> Vec<&Row> {
        self.rows
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
            .collect()
    }
    /// Whether a passed row compared numbers with the oracle: malformed-call rows pass on any
    /// error (the host's own argument checks reject `bad_input/*` before the plugin runs), so
    /// they alone say nothing about the plugin's results.
    pub fn verified(&self) -> bool {
        self.rows
            .iter()
            .any(|r| r.outcome == Outcome::Passed && r.worst.is_some())
    }
    /// Passed when nothing failed and at least one numeric case passed.
    pub fn passed(&self) -> bool {
        self.failed().is_empty() && self.verified()
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "plugin: {}", self.plugin)?;
        writeln!(f, "tolerance: {}", self.tolerance)?;
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(4);
        writeln!(
            f,
            "{:<width$}  {:>9}  {:>9}  result",
            "case", "worst", "max_err"
        )?;
        for r in &self.rows {
            let num =
                |x: Option<f64>, prec: usize| x.map_or("-".to_string(), |v| format!("{v:.prec$e}"));
            let result = match &r.outcome {
                Outcome::Passed => "ok".to_string(),
                Outcome::Skipped(why) => format!("skipped ({why})"),
                Outcome::Failed(why) => format!("FAILED: {why}"),
            };
            writeln!(
                f,
                "{:<width$}  {:>9}  {:>9}  {result}",
                r.name,
                num(r.worst, 2),
                num(r.max_err, 2)
            )?;
        }
        write!(
            f,
            "{} passed, {} skipped, {} failed of {} cases",
            self.count(|o| *o == Outcome::Passed),
            self.count(|o| matches!(o, Outcome::Skipped(_))),
            self.failed().len(),
            self.rows.len()
        )?;
        if !self.verified() {
            write!(
                f,
                "\nFAILED: nothing was verified (no case compared with the oracle passed: \
                 every numeric case was skipped or failed)"
            )?;
        }
        Ok(())
    }
}
