//! Benchmark figures as machine-readable records, one JSON line a figure, appended to the file
//! named by `MONO_BENCH_JSON` (nothing is written when it is unset). `tools/bench/benchmarks.py`
//! turns the records into BENCHMARKS.md, so a bench run on a GPU machine refreshes that page.
//!
//! A record: `table` (the kernel or launch), `case` (the shape, e.g. "128K x 4 rows"), `what` (the
//! variant timed), `figure` and `unit`, `floor` and `floor_how` (the least time the case could take
//! and how that was computed), `baseline` and `baseline_name` (another implementation measured in
//! the same run), `ratio` and `ratio_of` (the figure over the floor when there is one, else over
//! the baseline), `command`, `commit`, `date` (UTC, `YYYY-MM-DD`), `device` and an optional `note`. Cases name
//! their keys as [`keys_label`] does ("8K x 4 rows", "1M x 1 row"), so that a later run's record
//! replaces the same figure's. The run's commit and command come
//! from `MONO_BENCH_COMMIT` and `MONO_BENCH_COMMAND` (the binary has no repository beside it on a
//! GPU machine); without `MONO_BENCH_COMMAND` the command is the process's own arguments.

use crate::{DeviceError, Result};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

/// One measured figure, before the run's command, commit, date and device are added.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    pub table: String,
    pub case: String,
    pub what: String,
    pub figure: f64,
    pub unit: String,
    pub floor: Option<(f64, String)>,
    pub baseline: Option<(f64, String)>,
    pub note: Option<String>,
}

impl Figure {
    /// A figure with neither floor nor baseline.
    pub fn new(table: &str, case: &str, what: &str, figure: f64, unit: &str) -> Self {
        Self {
            table: table.into(),
            case: case.into(),
            what: what.into(),
            figure,
            unit: unit.into(),
            floor: None,
            baseline: None,
            note: None,
        }
    }

    /// The least time the case could take, and how it was computed.
    pub fn floor(mut self, value: f64, how: &str) -> Self {
        self.floor = Some((value, how.into()));
        self
    }

    /// Another implementation's figure measured in the same run.
    pub fn baseline(mut self, value: f64, name: &str) -> Self {
        self.baseline = Some((value, name.into()));
        self
    }

    /// What a reader needs beside the figure (e.g. the spread of several runs).
    pub fn note(mut self, text: &str) -> Self {
        self.note = Some(text.into());
        self
    }

    /// The figure over the floor, else over the baseline, and which of the two that is.
    pub fn ratio(&self) -> Option<(f64, &'static str)> {
        let floor = self.floor.as_ref().map(|(v, _)| (*v, "floor"));
        let baseline = self.baseline.as_ref().map(|(v, _)| (*v, "baseline"));
        floor
            .or(baseline)
            .filter(|(v, _)| *v != 0.0)
            .map(|(v, of)| (self.figure / v, of))
    }
}

/// The line written for one figure.
#[derive(Serialize)]
struct Record<'a> {
    table: &'a str,
    case: &'a str,
    what: &'a str,
    figure: f64,
    unit: &'a str,
    floor: Option<f64>,
    floor_how: Option<&'a str>,
    baseline: Option<f64>,
    baseline_name: Option<&'a str>,
    ratio: Option<f64>,
    ratio_of: Option<&'static str>,
    command: &'a str,
    commit: &'a str,
    date: &'a str,
    device: &'a str,
    note: Option<&'a str>,
}

/// Where a bench run's figures go, with what every record of the run shares.
#[derive(Clone, Debug)]
pub struct Reporter {
    path: Option<PathBuf>,
    command: String,
    commit: String,
    date: String,
    device: String,
}

impl Reporter {
    /// The reporter the environment asks for (`MONO_BENCH_JSON`, `MONO_BENCH_COMMIT`,
    /// `MONO_BENCH_COMMAND`); `device` names the GPU the figures are measured on.
    pub fn from_env(device: &str) -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let command = var("MONO_BENCH_COMMAND")
            .unwrap_or_else(|| std::env::args().collect::<Vec<_>>().join(" "));
        Self {
            path: var("MONO_BENCH_JSON").map(PathBuf::from),
            command,
            commit: var("MONO_BENCH_COMMIT").unwrap_or_else(|| "unknown".into()),
            date: utc_date(std::time::SystemTime::now()),
            device: device.into(),
        }
    }

    /// A reporter appending to `path` (`None`: one that writes nothing).
    pub fn to_path(path: Option<PathBuf>, command: &str, commit: &str, device: &str) -> Self {
        Self {
            path,
            command: command.into(),
            commit: commit.into(),
            date: utc_date(std::time::SystemTime::now()),
            device: device.into(),
        }
    }

    /// Whether records are written anywhere.
    pub fn is_on(&self) -> bool {
        self.path.is_some()
    }

    /// Appends the figure's record (one line); does nothing when the reporter is off.
    pub fn write(&self, f: &Figure) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let record = Record {
            table: &f.table,
            case: &f.case,
            what: &f.what,
            figure: f.figure,
            unit: &f.unit,
            floor: f.floor.as_ref().map(|(v, _)| *v),
            floor_how: f.floor.as_ref().map(|(_, h)| h.as_str()),
            baseline: f.baseline.as_ref().map(|(v, _)| *v),
            baseline_name: f.baseline.as_ref().map(|(_, n)| n.as_str()),
            ratio: f.ratio().map(|(r, _)| r),
            ratio_of: f.ratio().map(|(_, of)| of),
            command: &self.command,
            commit: &self.commit,
            date: &self.date,
            device: &self.device,
            note: f.note.as_deref(),
        };
        let fail = |source| DeviceError::Report {
            path: path.clone(),
            source,
        };
        let mut line = serde_json::to_string(&record).map_err(|e| fail(e.into()))?;
        line.push('\n');
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| file.write_all(line.as_bytes()))
            .map_err(fail)
    }
}

/// A key count as cases name it: 8192 is "8K", 1048576 "1M", 300000 "300K".
pub fn keys_label(n: u64) -> String {
    match n {
        0 => "0".into(),
        n if n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n if n % 1000 == 0 => format!("{}K", n / 1000),
        n => n.to_string(),
    }
}

/// A case of `rows` rows over `keys` keys as the tables name it: "8K x 1 row", "128K x 4 rows".
pub fn rows_case(keys: u64, rows: u32) -> String {
    let plural = if rows == 1 { "" } else { "s" };
    format!("{} x {rows} row{plural}", keys_label(keys))
}

/// The UTC calendar date of `t` as `YYYY-MM-DD` (days since 1970 to a civil date, proleptic
/// Gregorian).
fn utc_date(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Year, month and day of the day `days` after 1970-01-01: eras of 400 years (146,097 days),
/// years counted from March so that the leap day ends the year.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("mono-report-{}-{name}.jsonl", std::process::id()));
        let _ = std::fs::remove_file(&path);
        path
    }

    #[test]
    fn each_figure_is_one_line_with_the_runs_fields() {
        let path = scratch("lines");
        let r = Reporter::to_path(Some(path.clone()), "probes --bench", "abc1234", "H200");
        let copy = Figure::new("device", "2 GiB each way", "copy_16b", 3.94, "TB/s")
            .baseline(4.22, "PyTorch copy_");
        let score = Figure::new("indexer", "128K x 1 row", "wgmma", 12.0, "us")
            .floor(4.0, "bytes over copy bandwidth")
            .baseline(8.0, "copy kernel");
        r.write(&copy).unwrap();
        r.write(&score).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["table"], "device");
        assert_eq!(lines[0]["floor"], serde_json::Value::Null);
        assert_eq!(lines[0]["baseline_name"], "PyTorch copy_");
        assert!((lines[0]["ratio"].as_f64().unwrap() - 3.94 / 4.22).abs() < 1e-12);
        assert_eq!(lines[0]["ratio_of"], "baseline");
        // With a floor, the ratio is over the floor, not the baseline.
        assert_eq!(lines[1]["ratio"].as_f64(), Some(3.0));
        assert_eq!(lines[1]["ratio_of"], "floor");
        assert_eq!(lines[1]["floor_how"], "bytes over copy bandwidth");
        assert_eq!(lines[1]["note"], serde_json::Value::Null);
        for line in &lines {
            assert_eq!(line["commit"], "abc1234");
            assert_eq!(line["command"], "probes --bench");
            assert_eq!(line["device"], "H200");
            assert_eq!(line["date"].as_str().unwrap().len(), 10);
        }
    }

    #[test]
    fn a_reporter_without_a_file_writes_nothing() {
        let r = Reporter::to_path(None, "c", "x", "d");
        assert!(!r.is_on());
        r.write(&Figure::new("t", "c", "w", 1.0, "us")).unwrap();
    }

    #[test]
    fn an_unwritable_file_is_an_error_naming_it() {
        let path = std::env::temp_dir().join("mono-report-no-such-dir/x.jsonl");
        let r = Reporter::to_path(Some(path), "c", "x", "d");
        let e = r.write(&Figure::new("t", "c", "w", 1.0, "us")).unwrap_err();
        assert!(e.to_string().contains("no-such-dir"), "{e}");
    }

    #[test]
    fn key_counts_are_labelled_as_the_tables_name_them() {
        let labels = [8192, 131_072, 300_000, 524_288, 1 << 20, 2049, 0].map(keys_label);
        assert_eq!(labels, ["8K", "128K", "300K", "512K", "1M", "2049", "0"]);
        assert_eq!(rows_case(8192, 1), "8K x 1 row");
        assert_eq!(rows_case(131_072, 4), "128K x 4 rows");
    }

    #[test]
    fn days_become_calendar_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }
}
