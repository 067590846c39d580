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
    /// Passed when nothing failed and something ran.
    pub fn passed(&self) -> bool {
        self.failed().is_empty() && self.count(|o| *o == Outcome::Passed) > 0
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
        )
    }
}
