//! Seeded train/validation/test splits.

use std::fmt;
use std::str::FromStr;

use cpu_ops::Rng;

use crate::error::{DatasetProblem, Error, Result};

/// How many vertices one part of the split takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    /// This many vertices of every class (fewer if a class is smaller).
    PerClass(usize),
    /// This fraction of all vertices, in `[0, 1]`.
    Fraction(f64),
    /// Every vertex not taken by the other parts.
    Rest,
}

impl FromStr for Amount {
    type Err = String;
    /// `"20/class"`, `"0.1"` or `"rest"`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        if s == "rest" {
            return Ok(Self::Rest);
        }
        if let Some(n) = s.strip_suffix("/class") {
            return n
                .trim()
                .parse()
                .map(Self::PerClass)
                .map_err(|_| format!("`{s}`: expected N/class with a whole number N"));
        }
        match s.parse::<f64>() {
            Ok(f) if (0.0..=1.0).contains(&f) => Ok(Self::Fraction(f)),
            _ => Err(format!(
                "`{s}`: expected a fraction in [0, 1], `N/class` or `rest`"
            )),
        }
    }
}

/// A train/val/test split specification. Parts are drawn in the order train, val,
/// test from one seeded permutation, so they are disjoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SplitSpec {
    /// Training part.
    pub train: Amount,
    /// Validation part.
    pub val: Amount,
    /// Test part.
    pub test: Amount,
}

impl Default for SplitSpec {
    /// 60% / 20% / rest.
    fn default() -> Self {
        Self {
            train: Amount::Fraction(0.6),
            val: Amount::Fraction(0.2),
            test: Amount::Rest,
        }
    }
}

impl FromStr for SplitSpec {
    type Err = String;
    /// `"TRAIN,VAL,TEST"`, e.g. `"100/class,0.1,rest"` or `"0.6,0.2,0.2"`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let parts: Vec<&str> = s.split(',').collect();
        if parts.len() != 3 {
            return Err(format!(
                "`{s}`: expected three comma-separated parts TRAIN,VAL,TEST"
            ));
        }
        let spec = Self {
            train: parts[0].parse()?,
            val: parts[1].parse()?,
            test: parts[2].parse()?,
        };
        let rests = [spec.train, spec.val, spec.test]
            .iter()
            .filter(|a| matches!(a, Amount::Rest))
            .count();
        if rests > 1 {
            return Err(format!("`{s}`: at most one part may be `rest`"));
        }
        Ok(spec)
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PerClass(k) => write!(f, "{k}/class"),
            Self::Fraction(x) => write!(f, "{x}"),
            Self::Rest => f.write_str("rest"),
        }
    }
}

impl Amount {
    /// Whether this part asks for vertices (`0` and `0/class` do not).
    fn asks_for_vertices(self) -> bool {
        match self {
            Self::PerClass(k) => k > 0,
            Self::Fraction(f) => f > 0.0,
            Self::Rest => true,
        }
    }
}

/// The parts' names, in the order train, val, test.
const PARTS: [&str; 3] = ["train", "val", "test"];

impl SplitSpec {
    /// Draws the three masks for `labels` (values below `num_classes`) with `seed`.
    /// A part that asks for vertices (a fraction or count above 0, or `rest`)
    /// and draws none is an error naming the part: on a graph that small, its
    /// accuracy would read 0 for want of vertices. A part of `0` stays empty.
    pub fn apply(&self, labels: &[u32], num_classes: u32, seed: u64) -> Result<[Vec<u8>; 3]> {
        let n = labels.len();
        let mut order: Vec<u32> = (0..n as u32).collect();
        Rng::new(seed).shuffle(&mut order);
        let mut assigned = vec![0u8; n]; // 0 none, 1 train, 2 val, 3 test
        let parts = [self.train, self.val, self.test];
        let mut fraction_total = 0.0;
        for a in parts {
            if let Amount::Fraction(f) = a {
                fraction_total += f;
            }
        }
        if fraction_total > 1.0 + 1e-9 {
            return Err(Error::dataset(
                "split",
                &[],
                DatasetProblem::Split {
                    what: format!("fractions add up to {fraction_total}, more than 1"),
                },
            ));
        }
        // Rest goes last whatever its position, so the fixed parts are honoured.
        let mut idx: Vec<usize> = (0..3).collect();
        idx.sort_by_key(|&i| matches!(parts[i], Amount::Rest));
        for i in idx {
            let code = i as u8 + 1;
            match parts[i] {
                Amount::Fraction(f) => {
                    let want = (f * n as f64).round() as usize;
                    let mut got = 0;
                    for &v in &order {
                        if got == want {
                            break;
                        }
                        if assigned[v as usize] == 0 {
                            assigned[v as usize] = code;
                            got += 1;
                        }
                    }
                }
                Amount::PerClass(k) => {
                    let mut taken = vec![0usize; num_classes as usize];
                    for &v in &order {
                        let l = labels[v as usize];
                        if l >= num_classes {
                            return Err(Error::dataset(
                                "labels",
                                &[v as usize],
                                DatasetProblem::OutOfRange {
                                    value: l.into(),
                                    bound: num_classes.into(),
                                    bound_name: "num_classes",
                                },
                            ));
                        }
                        if assigned[v as usize] == 0 && taken[l as usize] < k {
                            assigned[v as usize] = code;
                            taken[l as usize] += 1;
                        }
                    }
                }
                Amount::Rest => {
                    for a in assigned.iter_mut().filter(|a| **a == 0) {
                        *a = code;
                    }
                }
            }
        }
        let sizes: Vec<usize> = (1..=3u8)
            .map(|code| assigned.iter().filter(|&&a| a == code).count())
            .collect();
        if let Some(i) = (0..3).find(|&i| n > 0 && sizes[i] == 0 && parts[i].asks_for_vertices()) {
            return Err(Error::dataset(
                "split",
                &[],
                DatasetProblem::Split {
                    what: format!(
                        "the {} part ({}) has no vertices: {n} vertices split {}/{}/{}; \
                         use a larger graph, or `0` for a part that should stay empty",
                        PARTS[i], parts[i], sizes[0], sizes[1], sizes[2]
                    ),
                },
            ));
        }
        let mask = |code: u8| assigned.iter().map(|&a| (a == code) as u8).collect();
        Ok([mask(1), mask(2), mask(3)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        let s: SplitSpec = "100/class,0.1,rest".parse().unwrap();
        assert_eq!(s.train, Amount::PerClass(100));
        assert_eq!(s.val, Amount::Fraction(0.1));
        assert_eq!(s.test, Amount::Rest);
        assert!("0.5,0.6".parse::<SplitSpec>().is_err());
        assert!("rest,rest,0.1".parse::<SplitSpec>().is_err());
        assert!("1.5,0,rest".parse::<SplitSpec>().is_err());
        assert!("x/class,0,rest".parse::<SplitSpec>().is_err());
    }

    #[test]
    fn per_class_and_rest_are_disjoint_and_seeded() {
        let labels: Vec<u32> = (0..1000).map(|i| i % 4).collect();
        let spec: SplitSpec = "10/class,0.2,rest".parse().unwrap();
        let [tr, va, te] = spec.apply(&labels, 4, 9).unwrap();
        assert_eq!(tr.iter().filter(|&&m| m == 1).count(), 40);
        assert_eq!(va.iter().filter(|&&m| m == 1).count(), 200);
        assert_eq!(te.iter().filter(|&&m| m == 1).count(), 760);
        for v in 0..1000 {
            assert_eq!(tr[v] + va[v] + te[v], 1);
        }
        for c in 0..4 {
            let k = (0..1000).filter(|&v| tr[v] == 1 && labels[v] == c).count();
            assert_eq!(k, 10);
        }
        assert_eq!(spec.apply(&labels, 4, 9).unwrap(), [tr, va, te]);
        assert_ne!(
            spec.apply(&labels, 4, 10).unwrap()[0],
            spec.apply(&labels, 4, 9).unwrap()[0]
        );
    }

    /// Three vertices split 60% / 20% / rest leave the test part empty: an
    /// error naming it, not a test accuracy of 0 later. A part of 0 may be empty.
    #[test]
    fn a_part_that_draws_no_vertex_is_an_error_naming_it() {
        let e = SplitSpec::default()
            .apply(&[0, 1, 0], 2, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the test part (rest) has no vertices"), "{e}");
        assert!(e.contains("3 vertices split 2/1/0"), "{e}");
        let e = "0.5,0.1,rest"
            .parse::<SplitSpec>()
            .unwrap()
            .apply(&[0; 4], 1, 0);
        assert!(e.unwrap_err().to_string().contains("the val part (0.1)"));
        let e = "5/class,0,rest"
            .parse::<SplitSpec>()
            .unwrap()
            .apply(&[0; 4], 1, 0);
        assert!(e.unwrap_err().to_string().contains("the test part (rest)"));
        let [tr, va, te] = "1,0,0/class"
            .parse::<SplitSpec>()
            .unwrap()
            .apply(&[0; 3], 1, 0)
            .unwrap();
        assert_eq!((tr, va, te), (vec![1; 3], vec![0; 3], vec![0; 3]));
    }

    #[test]
    fn fractions_over_one_rejected() {
        let spec: SplitSpec = "0.7,0.7,rest".parse().unwrap();
        assert!(spec.apply(&[0; 10], 1, 0).is_err());
    }
}
