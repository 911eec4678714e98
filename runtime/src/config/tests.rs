use std::path::Path;

use super::*;
use crate::error::ConfigProblem;

fn parse(s: &str) -> Result<TrainConfig> {
    TrainConfig::from_toml(s, Path::new("t.toml"))
}

#[test]
fn empty_file_gives_defaults_and_round_trips() {
    let c = parse("").unwrap();
    assert_eq!(c, TrainConfig::default());
    let back = parse(&c.to_toml()).unwrap();
    assert_eq!(back, c);
}

#[test]
fn unknown_keys_and_wrong_types_name_the_key() {
    let e = parse("[train]\nepoch = 3\n").unwrap_err().to_string();
    assert!(e.contains("t.toml") && e.contains("epoch"), "{e}");
    let e = parse("[model]\nhidden = \"big\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("t.toml") && e.contains("hidden"), "{e}");
    let e = parse("[nope]\n").unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
}

#[test]
fn ranges_are_checked() {
    for (toml, key) in [
        ("[model]\nkind = \"mlp\"", "model.kind"),
        ("[model]\ndropout = 1.0", "model.dropout"),
        ("[model]\nlayers = 3", "train.fanouts"),
        (
            "[model]\nkind = \"gat\"\nhidden = 10\nheads = 4",
            "model.hidden",
        ),
        ("[train]\nfanouts = [10, 0]", "train.fanouts"),
        ("[train]\nlr = 0.0", "train.lr"),
        ("[train]\neval_mode = \"exact\"", "train.eval_mode"),
        ("[device]\nfeature_dtype = \"fp16\"", "device.feature_dtype"),
        ("[train]\non_nonfinite = \"ignore\"", "train.on_nonfinite"),
        ("[train]\nbatch_size = 0", "train.batch_size"),
        (
            "[data.synthetic]\nhomophily = 2.0",
            "data.synthetic.homophily",
        ),
    ] {
        let e = parse(toml).unwrap_err().to_string();
        assert!(e.contains(key), "{toml}: {e}");
    }
}

#[test]
fn overrides_apply_with_toml_values() {
    let c = TrainConfig::from_toml_with_overrides(
        "[train]\nepochs = 3\n",
        Path::new("t.toml"),
        &[
            "train.epochs=7".into(),
            "model.kind=gcn".into(),
            "train.fanouts=[5,-1]".into(),
            "data.path=\"x.tds\"".into(),
        ],
    )
    .unwrap();
    assert_eq!(c.train.epochs, 7);
    assert_eq!(c.model.kind, ModelKind::Gcn);
    assert_eq!(c.train_fanouts().unwrap(), vec![5, ALL_NEIGHBORS]);
    // An override's relative path is the current directory's, made absolute.
    let here = std::env::current_dir().unwrap();
    assert_eq!(c.data.path, Some(here.join("x.tds")));
    assert_eq!(
        c.data.path_origin.as_deref(),
        Some("--set data.path=\"x.tds\"")
    );
    let e = TrainConfig::from_toml_with_overrides("", Path::new("t"), &["x".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--set"), "{e}");
}

/// A config file's relative `data.path` is taken from the file's folder, as
/// Cargo takes a manifest's paths; an override's from the current directory; a
/// TOML string's is kept as given. The configuration says which layer set it.
#[test]
fn a_relative_data_path_is_taken_from_the_config_files_folder() {
    let d = tempfile::tempdir().unwrap();
    let sub = d.path().join("configs");
    std::fs::create_dir(&sub).unwrap();
    let file = sub.join("run.toml");
    std::fs::write(&file, "[data]\npath = \"../data/g.tds\"\n").unwrap();
    let c = TrainConfig::load(&file, &[]).unwrap();
    let want = std::path::absolute(sub.join("../data/g.tds")).unwrap();
    assert_eq!(c.data.path.as_deref(), Some(want.as_path()));
    assert!(c.data.path.as_ref().unwrap().is_absolute());
    assert_eq!(c.data.path_origin, Some(file.display().to_string()));
    // Saved and read back (a run's config.toml), it names the same file.
    let saved = d.path().join("elsewhere.toml");
    std::fs::write(&saved, c.to_toml()).unwrap();
    assert_eq!(
        TrainConfig::load(&saved, &[]).unwrap().data.path,
        c.data.path
    );
    // An absolute path stays as it is.
    std::fs::write(&file, "[data]\npath = \"/srv/g.tds\"\n").unwrap();
    let c = TrainConfig::load(&file, &[]).unwrap();
    assert_eq!(c.data.path.as_deref(), Some(Path::new("/srv/g.tds")));
    // --set wins, relative to the current directory.
    let c = TrainConfig::load(&file, &["data.path=\"h.tds\"".into()]).unwrap();
    let here = std::env::current_dir().unwrap();
    assert_eq!(c.data.path, Some(here.join("h.tds")));
    assert_eq!(
        c.data.path_origin.as_deref(),
        Some("--set data.path=\"h.tds\"")
    );
    // A TOML string has no folder: its path is kept.
    let c = TrainConfig::from_toml("[data]\npath = \"g.tds\"\n", Path::new("s")).unwrap();
    assert_eq!(c.data.path.as_deref(), Some(Path::new("g.tds")));
}

fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn device_and_threads_sections_parse_and_name_bad_values() {
    let c = parse("").unwrap();
    assert_eq!(c.device.kind, DeviceKind::Auto);
    assert_eq!(c.device.cache_bytes, 4 << 30);
    assert_eq!(c.device.topology, TopologyChoice::Auto);
    assert_eq!((c.threads.compute, c.threads.pin), (0, PinPolicy::None));
    let c = parse(
        "[device]\nkind = \"cuda\"\nordinal = 1\ncache_bytes = 0\ntopology = \"pinned-host\"\n\
         [threads]\ncompute = 3\npin = \"cores\"\n",
    )
    .unwrap();
    assert_eq!(c.device.kind, DeviceKind::Cuda);
    assert_eq!(c.device.topology, TopologyChoice::PinnedHost);
    assert_eq!((c.threads.compute, c.threads.pin), (3, PinPolicy::Cores));
    assert_eq!(parse(&c.to_toml()).unwrap(), c);
    // `"auto"` for both placement keys, and back through TOML.
    let c = parse("[device]\ncache_bytes = \"auto\"\ntopology = \"auto\"\n").unwrap();
    assert_eq!(c.device.cache_bytes, CACHE_BYTES_AUTO);
    assert_eq!(c.device.topology, TopologyChoice::Auto);
    assert!(
        c.to_toml().contains("cache_bytes = \"auto\""),
        "{}",
        c.to_toml()
    );
    assert_eq!(parse(&c.to_toml()).unwrap(), c);
    for (toml, key) in [
        ("[device]\ncache_bytes = \"all\"", "device.cache_bytes"),
        ("[device]\nkind = \"gpu\"", "device.kind"),
        ("[device]\ntopology = \"host\"", "device.topology"),
        ("[device]\nordinal = -1", "device.ordinal"),
        ("[device]\ncache_bytes = -5", "device.cache_bytes"),
        ("[device]\nmemory = 5", "memory"),
        ("[threads]\npin = \"numa\"", "threads.pin"),
        ("[threads]\ncompute = 5000", "threads.compute"),
        ("[threads]\ncompute = \"all\"", "threads.compute"),
    ] {
        let e = parse(toml).unwrap_err().to_string();
        assert!(e.contains(key), "{toml}: {e}");
    }
    let e = parse("[threads]\ncompute = 5000").unwrap_err().to_string();
    assert!(e.contains("0..=4096"), "{e}");
    // A custom message of the schema ("expected a byte count ...") is said once.
    let e = parse("[device]\ncache_bytes = \"all\"")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("expected a byte count") && !e.contains("expected expected"),
        "{e}"
    );
}

#[test]
fn upper_bounds_and_toml_integer_limits_are_checked() {
    for (toml, key, range) in [
        ("[model]\nlayers = 17", "model.layers", "1..=16"),
        ("[model]\nhidden = 100000", "model.hidden", "1..=65536"),
        ("[train]\nepochs = 2000000", "train.epochs", "1..=1000000"),
        (
            "[data.synthetic]\nvertices = 10\nclasses = 11",
            "data.synthetic.classes",
            "1..=10",
        ),
        (
            "[data.synthetic]\nedges = 400000000000000000",
            "data.synthetic.edges",
            "",
        ),
        ("[data.synthetic]\ndim = 0", "data.synthetic.dim", ""),
    ] {
        let e = parse(toml).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains(range), "{toml}: {e}");
    }
    // Values a program can set but TOML cannot print back are refused.
    let mut c = TrainConfig::default();
    c.train.seed = u64::MAX;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("train.seed") && e.contains("9223372036854775807"),
        "{e}"
    );
    let mut c = TrainConfig::default();
    c.device.cache_bytes = u64::MAX - 1;
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("device.cache_bytes"));
}

#[test]
fn env_variables_map_to_dotted_keys() {
    let o = env_overrides(vars(&[
        ("TANDEM_TRAIN__BATCH_SIZE", "512"),
        ("TANDEM_DATA__SYNTHETIC__VERTICES", " 1000 "),
        ("TANDEM_REQUIRE_WORDNET", "1"),
        ("PATH", "/bin"),
        ("TANDEM_MODEL__KIND", "gcn"),
    ]))
    .unwrap();
    let keys: Vec<(&str, &str, &str)> = o
        .iter()
        .map(|o| (o.origin.as_str(), o.key.as_str(), o.value.as_str()))
        .collect();
    assert_eq!(
        keys,
        vec![
            (
                "TANDEM_DATA__SYNTHETIC__VERTICES",
                "data.synthetic.vertices",
                "1000"
            ),
            ("TANDEM_MODEL__KIND", "model.kind", "gcn"),
            ("TANDEM_TRAIN__BATCH_SIZE", "train.batch_size", "512"),
        ]
    );
    let e = env_overrides(vars(&[("TANDEM_TRAIN____LR", "1")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("TANDEM_TRAIN____LR"), "{e}");
    let e = env_overrides(vars(&[
        ("TANDEM_TRAIN__LR", "1"),
        ("TANDEM_train__lr", "2"),
    ]))
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("TANDEM_TRAIN__LR") && e.contains("TANDEM_train__lr"),
        "{e}"
    );
    #[cfg(unix)]
    {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0xff, 0xfe]);
        let e = env_overrides(vec![(OsString::from("TANDEM_TRAIN__LR"), bad)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("TANDEM_TRAIN__LR") && e.contains("UTF-8"), "{e}");
    }
}

#[test]
fn layers_apply_file_then_env_then_set_and_errors_name_the_source() {
    let file = "[train]\nepochs = 3\nlr = 0.1\nbatch_size = 64\n";
    let mut layers = env_overrides(vars(&[
        ("TANDEM_TRAIN__EPOCHS", "5"),
        ("TANDEM_TRAIN__LR", "0.2"),
    ]))
    .unwrap();
    layers.push(Override::from_set("train.epochs=7").unwrap());
    let c = TrainConfig::from_layers(file, Path::new("run.toml"), &layers).unwrap();
    assert_eq!(
        (c.train.epochs, c.train.lr, c.train.batch_size),
        (7, 0.2, 64)
    );
    // Cross-key checks run once at the end: layers set by env, fanouts by --set.
    let layers = vec![
        env_overrides(vars(&[("TANDEM_MODEL__LAYERS", "3")])).unwrap()[0].clone(),
        Override::from_set("train.fanouts=[5,5,5]").unwrap(),
    ];
    let c = TrainConfig::from_layers("", Path::new("d"), &layers).unwrap();
    assert_eq!(c.model.layers, 3);

    let env = |k: &str, v: &str| {
        TrainConfig::from_layers(
            file,
            Path::new("run.toml"),
            &env_overrides(vars(&[(k, v)])).unwrap(),
        )
        .unwrap_err()
        .to_string()
    };
    let e = env("TANDEM_TRAIN__EPOCH", "5");
    assert!(
        e.contains("TANDEM_TRAIN__EPOCH") && e.contains("train.epoch"),
        "{e}"
    );
    let e = env("TANDEM_TRAIN__EPOCHS", "many");
    assert!(
        e.contains("TANDEM_TRAIN__EPOCHS") && e.contains("epochs"),
        "{e}"
    );
    let e = env("TANDEM_TRAIN__LR", "0");
    assert!(
        e.contains("train.lr") && e.contains("> 0") && e.starts_with("TANDEM_TRAIN__LR: "),
        "{e}"
    );
    let e = env("TANDEM_TRAIN__EPOCHS__X", "1");
    assert!(
        e.contains("TANDEM_TRAIN__EPOCHS__X") && e.contains("not a table"),
        "{e}"
    );
    let e =
        TrainConfig::from_toml_with_overrides(file, Path::new("run.toml"), &["train.lr=-1".into()])
            .unwrap_err();
    assert!(
        matches!(&e, Error::Config { origin, key, problem: ConfigProblem::BadValue { found, .. } }
            if origin == "--set train.lr=-1" && key == "train.lr" && found == "-1"),
        "{e:?}"
    );
    // A range error in the file itself names the file (no override to blame).
    let e = parse("[train]\nlr = -1\n").unwrap_err();
    assert!(
        matches!(&e, Error::Config { origin, key, problem: ConfigProblem::BadValue { .. } }
            if origin == "t.toml" && key == "train.lr"),
        "{e:?}"
    );
}

/// Every kind of configuration mistake is an [`Error::Config`] a program can
/// match: the key, the kind (unknown key, bad value, syntax) and where it came
/// from; the message is one line (not the TOML parser's multi-line report).
#[test]
fn config_errors_are_structured_and_one_line() {
    let one_line = |e: &Error| {
        let m = e.to_string();
        assert!(!m.contains('\n'), "{m}");
        m
    };
    // Unknown key, in a section and at the top level.
    let e = parse("[train]\nepoch = 3\n").unwrap_err();
    assert!(
        matches!(&e, Error::Config { origin, key, problem: ConfigProblem::UnknownKey { expected } }
            if origin == "t.toml" && key == "train.epoch" && expected.contains("epochs")),
        "{e:?}"
    );
    assert!(one_line(&e).starts_with("t.toml: key `train.epoch`: unknown key"));
    let e = parse("[nope]\n").unwrap_err();
    assert!(
        matches!(&e, Error::Config { key, problem: ConfigProblem::UnknownKey { .. }, .. } if key == "nope"),
        "{e:?}"
    );
    let e = parse("[data.synthetic]\nvertexes = 5\n").unwrap_err();
    assert!(
        matches!(&e, Error::Config { key, problem: ConfigProblem::UnknownKey { .. }, .. }
            if key == "data.synthetic.vertexes"),
        "{e:?}"
    );
    // A value of the wrong type, and a name not in the list.
    let e = parse("[model]\nhidden = \"big\"\n").unwrap_err();
    assert!(
        matches!(&e, Error::Config { key, problem: ConfigProblem::BadValue { found, .. }, .. }
            if key == "model.hidden" && found.contains("big")),
        "{e:?}"
    );
    one_line(&e);
    let e = parse("[model]\nkind = \"mlp\"\n").unwrap_err();
    assert!(
        matches!(&e, Error::Config { key, problem: ConfigProblem::BadValue { found, .. }, .. }
            if key == "model.kind" && found.contains("mlp")),
        "{e:?}"
    );
    one_line(&e);
    // A range.
    let e = parse("[train]\nbatch_size = 0\n").unwrap_err();
    assert!(
        matches!(&e, Error::Config { key, problem: ConfigProblem::BadValue { found, .. }, .. }
            if key == "train.batch_size" && found == "0"),
        "{e:?}"
    );
    // TOML syntax: line and column of the mistake.
    let e = parse("[train]\nepochs = 3\nlr = = 2\n").unwrap_err();
    assert!(
        matches!(&e, Error::Config { origin, key, problem: ConfigProblem::Syntax { line: 3, .. } }
            if origin == "t.toml" && key.is_empty()),
        "{e:?}"
    );
    assert!(one_line(&e).starts_with("t.toml: line 3, column "), "{e}");
    // From a string, the origin says so.
    let e = TrainConfig::from_toml("[train]\nepoch = 3\n", Path::new("<toml string>")).unwrap_err();
    assert!(
        matches!(&e, Error::Config { origin, .. } if origin == "<toml string>"),
        "{e:?}"
    );
    // A bad override names the override.
    let e = TrainConfig::from_toml_with_overrides(
        "",
        Path::new("t.toml"),
        &["train.epochs=\"x\"".into()],
    )
    .unwrap_err();
    assert!(
        matches!(&e, Error::Config { origin, key, problem: ConfigProblem::BadValue { .. } }
            if origin.starts_with("--set train.epochs") && key == "train.epochs"),
        "{e:?}"
    );
}

#[test]
fn deprecated_train_threads_folds_into_threads_compute() {
    let c = parse("[train]\nthreads = 2\n").unwrap();
    assert_eq!((c.threads.compute, c.train.threads), (2, None));
    assert!(!c.to_toml().contains("[train]\nthreads") && c.compute_threads() == 2);
    let c = parse("[train]\nthreads = 2\n[threads]\ncompute = 2\n").unwrap();
    assert_eq!(c.threads.compute, 2);
    let e = parse("[train]\nthreads = 2\n[threads]\ncompute = 3\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("train.threads") && e.contains("threads.compute = 3"),
        "{e}"
    );
    // Set in code: honoured without folding, and checked.
    let mut c = TrainConfig::default();
    c.train.threads = Some(3);
    assert_eq!(c.compute_threads(), 3);
    c.validate().unwrap();
    c.threads.compute = 1;
    assert!(c.validate().is_err());
}

/// Dotted keys and values of a TOML table, depth first.
fn flatten(prefix: &str, t: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in t {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(sub) => flatten(&key, sub, out),
            other => out.push((key, other.clone())),
        }
    }
}

fn same_value(a: &toml::Value, b: &toml::Value) -> bool {
    match (a, b) {
        (toml::Value::Float(x), toml::Value::Float(y)) => {
            (x - y).abs() <= 1e-6 * x.abs().max(y.abs())
        }
        (toml::Value::Array(x), toml::Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        _ => a == b,
    }
}

#[test]
fn orchestration_section_parses_and_names_bad_values() {
    let c = parse("").unwrap();
    assert_eq!(c.orchestration.policy, Policy::Auto);
    assert_eq!(c.orchestration.hot_ratio, 0.0);
    assert!(!c.orchestration.reuses_embeddings());
    let c = parse(
        "[orchestration]\npolicy = \"layer\"\nhot_ratio = 0.2\nhotness = \"degree\"\nsuper_batch = 2\n\
         staleness_bound = 3\non_late = \"compute\"\npresample_epochs = 1",
    )
    .unwrap();
    let o = &c.orchestration;
    assert!(o.reuses_embeddings());
    assert_eq!(o.hotness, Hotness::Degree);
    assert_eq!(o.on_late, OnLate::Compute);
    assert_eq!((o.super_batch, o.staleness_bound), (2, 3));
    for (text, key) in [
        (
            "[orchestration]\nhot_ratio = 1.5",
            "orchestration.hot_ratio",
        ),
        (
            "[orchestration]\nhot_ratio = -0.1",
            "orchestration.hot_ratio",
        ),
        ("[orchestration]\npolicy = \"gpu\"", "orchestration.policy"),
        (
            "[orchestration]\nhotness = \"random\"",
            "orchestration.hotness",
        ),
        (
            "[orchestration]\non_late = \"skip\"",
            "orchestration.on_late",
        ),
        (
            "[orchestration]\nsuper_batch = 0",
            "orchestration.super_batch",
        ),
        (
            "[orchestration]\npresample_epochs = 0",
            "orchestration.presample_epochs",
        ),
        (
            "[orchestration]\nstaleness_bound = -1",
            "orchestration.staleness_bound",
        ),
        // Reuse needs a layer above the bottom.
        (
            "[model]\nlayers = 1\n[train]\nfanouts = [5]\n\
             [orchestration]\nhot_ratio = 0.2",
            "orchestration.hot_ratio",
        ),
    ] {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
    // Reuse is for the layer-based policy only.
    let e = parse("[orchestration]\npolicy = \"gpu-sample-gpu-gather\"\nhot_ratio = 0.2")
        .unwrap_err()
        .to_string();
    assert!(e.contains("only \"layer\""), "{e}");
}

/// The shipped example configs load and validate; `run.toml` spells out
/// the defaults (so the README's first example is the default run).
#[test]
fn example_configs_load_and_run_toml_is_the_defaults() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/configs");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("examples/configs") {
        let path = entry.expect("entry").path();
        let c = TrainConfig::load(&path, &[]).unwrap_or_else(|e| panic!("{e}"));
        c.validate()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        names.push(path.file_name().unwrap().to_string_lossy().into_owned());
        if path.ends_with("run.toml") {
            assert_eq!(c, TrainConfig::default(), "run.toml is not the defaults");
        }
    }
    assert!(names.iter().any(|n| n == "run.toml"), "{names:?}");
}

#[test]
fn docs_list_every_key_with_its_default() {
    let doc_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/config.md");
    let doc = std::fs::read_to_string(doc_path).expect("docs/config.md");
    // Rows `| `key` | type | default | unit | allowed | meaning |`.
    let mut rows: Vec<(String, String)> = Vec::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 8 || !cells[1].starts_with('`') {
            continue;
        }
        let key = cells[1].trim_matches('`').to_string();
        assert!(
            !rows.iter().any(|(k, _)| *k == key),
            "docs/config.md lists `{key}` twice"
        );
        rows.push((key, cells[3].to_string()));
    }
    let table: toml::Table = TrainConfig::default().to_toml().parse().unwrap();
    let mut defaults = Vec::new();
    flatten("", &table, &mut defaults);
    assert!(defaults.len() > 30, "{defaults:?}");
    for (key, value) in &defaults {
        let (_, cell) = rows
            .iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("docs/config.md does not list `{key}`"));
        let documented = format!("v = {}", cell.trim_matches('`'))
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| panic!("`{key}`: default cell {cell} is not a TOML value"));
        assert!(
            same_value(&documented, value),
            "`{key}`: docs/config.md says {cell}, the schema's default is {value}"
        );
    }
    // Keys without a default (unset) exist: setting them parses.
    for (key, cell) in &rows {
        if defaults.iter().any(|(k, _)| k == key) {
            continue;
        }
        assert_eq!(cell, "unset", "`{key}` is documented but not in the schema");
        let sets: Vec<String> = match key.as_str() {
            "data.path" => vec![format!("{key}=\"x.tds\"")],
            // A partition file only goes with partitioned features.
            "dist.partition_file" => vec![
                "dist.features=\"partitioned\"".into(),
                "train.eval_mode=\"sampled\"".into(),
                format!("{key}=\"p.txt\""),
            ],
            _ => vec![format!("{key}=0")],
        };
        TrainConfig::from_toml_with_overrides("", Path::new("doc"), &sets)
            .unwrap_or_else(|e| panic!("documented key `{key}` is refused: {e}"));
    }
}

#[test]
fn model_precision_is_auto_by_default_tf32_on_cuda_and_fp32_on_the_host() {
    use super::ModelPrecision;
    use gpu_ops::Precision;
    let c = TrainConfig::from_toml_with_overrides("", Path::new("t"), &[]).expect("default");
    assert_eq!(c.model.precision, ModelPrecision::Auto);
    let auto = c.model.precision;
    assert_eq!(auto.resolve(true, ModelKind::Sage), Precision::Tf32);
    assert_eq!(auto.resolve(true, ModelKind::Gcn), Precision::Tf32);
    assert_eq!(auto.resolve(true, ModelKind::Gat), Precision::Fp32);
    for kind in [ModelKind::Sage, ModelKind::Gcn, ModelKind::Gat] {
        assert_eq!(auto.resolve(false, kind), Precision::Fp32);
    }
    for (name, want) in [
        ("auto", ModelPrecision::Auto),
        ("fp32", ModelPrecision::Fp32),
        ("tf32", ModelPrecision::Tf32),
    ] {
        let set = format!("model.precision=\"{name}\"");
        let c = TrainConfig::from_toml_with_overrides("", Path::new("t"), &[set]).expect(name);
        assert_eq!(c.model.precision, want);
        assert_eq!(want.to_string(), name);
    }
    for on_cuda in [false, true] {
        for kind in [ModelKind::Sage, ModelKind::Gat] {
            assert_eq!(ModelPrecision::Fp32.resolve(on_cuda, kind), Precision::Fp32);
            assert_eq!(ModelPrecision::Tf32.resolve(on_cuda, kind), Precision::Tf32);
        }
    }
    let e = TrainConfig::from_toml_with_overrides(
        "",
        Path::new("t"),
        &["model.precision=\"fp16\"".to_string()],
    )
    .unwrap_err();
    assert!(e.to_string().contains("model.precision"), "{e}");
}

#[test]
fn empty_eval_fanouts_raise_each_training_fanout_to_the_floor() {
    let c = parse("[train]\nfanouts = [10, 25]\n").unwrap();
    assert_eq!(c.eval_fanouts().unwrap(), vec![20, 25]);
    let c = parse("[model]\nlayers = 3\n[train]\nfanouts = [15, -1, 5]\n").unwrap();
    assert_eq!(c.eval_fanouts().unwrap(), vec![20, ALL_NEIGHBORS, 20]);
    // Set explicitly, they are taken as they are (a fanout below the floor too).
    let c = parse("[train]\nfanouts = [10, 10]\neval_fanouts = [5, -1]\n").unwrap();
    assert_eq!(c.eval_fanouts().unwrap(), vec![5, ALL_NEIGHBORS]);
    assert_eq!(DEFAULT_EVAL_FANOUT_FLOOR, 20);
}
