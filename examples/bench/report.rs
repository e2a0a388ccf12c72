//! Figures: a median with its spread, and a tiny JSON object writer.

/// The median of per-rep figures, with their minimum and maximum (the spread).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spread {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Spread {
    pub(crate) fn of(values: &[f64]) -> Spread {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Spread {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
            };
        }
        v.sort_by(|a, b| a.total_cmp(b));
        Spread {
            median: v[v.len() / 2],
            min: v[0],
            max: v[v.len() - 1],
        }
    }
}

pub(crate) fn median(values: &[f64]) -> f64 {
    Spread::of(values).median
}

/// The value below which a fraction `p` of `sorted` lies.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A JSON object, written in the order its fields were added.
#[derive(Default)]
pub(crate) struct Json(Vec<(String, String)>);

fn number(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.4}")
    } else {
        "null".into()
    }
}

impl Json {
    pub(crate) fn num(mut self, k: &str, v: f64) -> Self {
        self.0.push((k.into(), number(v)));
        self
    }

    /// `k`: the median; `k_min_max`: the spread over reps.
    pub(crate) fn spread(mut self, k: &str, s: Spread) -> Self {
        self.0.push((k.into(), number(s.median)));
        self.0.push((
            format!("{k}_min_max"),
            format!("[{}, {}]", number(s.min), number(s.max)),
        ));
        self
    }

    pub(crate) fn int(mut self, k: &str, v: u64) -> Self {
        self.0.push((k.into(), v.to_string()));
        self
    }

    pub(crate) fn str(mut self, k: &str, v: &str) -> Self {
        self.0.push((k.into(), format!("{v:?}")));
        self
    }

    pub(crate) fn obj(mut self, k: &str, v: Json) -> Self {
        self.0.push((k.into(), v.render()));
        self
    }

    pub(crate) fn render(&self) -> String {
        let fields: Vec<String> = self.0.iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
        format!("{{{}}}", fields.join(", "))
    }
}
