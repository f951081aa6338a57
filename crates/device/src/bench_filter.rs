//! Case filters for the GPU benches: a comma list in an environment variable picks the cases to
//! run (e.g. under a profiler, or to spend less device time); an unset variable picks every case.

/// The cases one environment variable picks.
#[derive(Clone, Debug)]
pub struct BenchFilter {
    picked: Option<Vec<String>>,
}

impl BenchFilter {
    /// Reads `name`. A value that names none of `known` is an error, so that a typo cannot leave
    /// a bench timing nothing.
    pub fn from_env(name: &str, known: &[String]) -> Result<Self, String> {
        match std::env::var(name) {
            Ok(list) => Self::parse(name, &list, known),
            Err(_) => Ok(Self { picked: None }),
        }
    }

    fn parse(name: &str, list: &str, known: &[String]) -> Result<Self, String> {
        let picked: Vec<String> = list.split(',').map(|v| v.trim().to_string()).collect();
        match picked.iter().find(|v| !known.contains(v)) {
            Some(bad) => Err(format!(
                "{name}={list}: {bad:?} is not one of {}",
                known.join(", ")
            )),
            None => Ok(Self {
                picked: Some(picked),
            }),
        }
    }

    /// Whether the case named `value` runs.
    pub fn allows(&self, value: &str) -> bool {
        self.picked
            .as_ref()
            .is_none_or(|p| p.iter().any(|v| v == value))
    }
}

#[cfg(test)]
mod tests {
    use super::BenchFilter;

    fn known() -> Vec<String> {
        ["8192", "131072"].map(String::from).to_vec()
    }

    #[test]
    fn a_list_picks_its_cases_and_no_others() {
        let f = BenchFilter::parse("KEYS", "131072", &known()).unwrap();
        assert!(f.allows("131072"));
        assert!(!f.allows("8192"));
    }

    #[test]
    fn a_value_naming_no_case_is_an_error() {
        let e = BenchFilter::parse("KEYS", "8192, 13107", &known()).unwrap_err();
        assert!(e.contains("\"13107\""), "{e}");
    }

    #[test]
    fn no_variable_picks_every_case() {
        let f = BenchFilter { picked: None };
        assert!(f.allows("8192") && f.allows("anything"));
    }
}
