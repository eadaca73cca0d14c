//! `files::Bpe` in its formats: a directory, Hugging Face `tokenizer.json`, tiktoken
//! rank files. Round trips are exact; bad input is refused naming the file and entry.

#[allow(dead_code)]
mod encode_gpt2;
mod published;

use std::path::Path;

use encode_gpt2::generated_text;
use serde_json::{json, Value};
use tinylm_bpe::files::{hf, tiktoken, Bpe, MAX_UNUSED_IDS};
use tinylm_bpe::pretokenize::Pattern;
use tinylm_bpe::train::{train_bpe_with, TrainOptions};

const EOT: &str = "<|endoftext|>";
/// A regex that is none of the named patterns: words, digits, and (dropped or kept as
/// gaps) whatever else.
const CUSTOM: &str = r"\p{L}+|\p{N}";

fn patterns() -> Vec<Pattern> {
    vec![
        Pattern::Gpt2,
        Pattern::Gpt4,
        Pattern::O200k,
        Pattern::from_regex(CUSTOM, false).unwrap(),
        Pattern::from_regex(CUSTOM, true).unwrap(),
    ]
}

/// A tokenizer trained with `pattern` on generated text (256 bytes, two specials, merges).
fn trained(dir: &Path, pattern: &Pattern) -> Bpe {
    let text = dir.join("corpus.txt");
    let docs: Vec<String> = (0..8).map(|s| generated_text(s, 300)).collect();
    std::fs::write(&text, docs.join(EOT)).unwrap();
    let specials = [EOT.to_string(), "<|pad|>".to_string()];
    let options = TrainOptions {
        pattern,
        ..TrainOptions::default()
    };
    let (vocab, merges) = train_bpe_with(&text, 600, &specials, options).unwrap();
    let bpe = Bpe::new(vocab, merges, pattern.clone()).unwrap();
    assert_eq!(bpe.specials, [256, 257]);
    assert_eq!(bpe.special_tokens(), [EOT, "<|pad|>"]);
    bpe
}

fn err<T: std::fmt::Debug>(r: tinylm_bpe::Result<T>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn directory_and_tokenizer_json_round_trip_for_each_pattern() {
    let dir = tempfile::tempdir().unwrap();
    for (i, pattern) in patterns().into_iter().enumerate() {
        let bpe = trained(dir.path(), &pattern);
        let json = dir.path().join(format!("tokenizer{i}.json"));
        hf::save(&json, &bpe).unwrap();
        assert_eq!(hf::load(&json).unwrap(), bpe, "{}", pattern.regex());
        let out = dir.path().join(format!("tok{i}"));
        bpe.save(&out).unwrap();
        for file in ["vocab.json", "merges.txt", "tokenizer.json"] {
            assert!(out.join(file).is_file(), "{file}");
        }
        let back = Bpe::load(&out).unwrap();
        assert_eq!(back, bpe);
        assert_eq!(back.pattern.keeps_gaps(), pattern.keeps_gaps());
        // Without tokenizer.json the directory reads as GPT-2 files: the pattern is lost.
        std::fs::remove_file(out.join("tokenizer.json")).unwrap();
        let gpt2 = Bpe::load(&out).unwrap();
        assert_eq!((&gpt2.vocab, &gpt2.merges), (&bpe.vocab, &bpe.merges));
        assert_eq!(
            (&gpt2.specials, &gpt2.pattern),
            (&bpe.specials, &Pattern::Gpt2)
        );
        // The encoder has the pattern and the special tokens.
        let tokenizer = bpe.tokenizer().unwrap();
        assert_eq!(tokenizer.pattern(), &pattern);
        assert_eq!(tokenizer.encode(EOT), [256]);
    }
}

#[test]
fn tokenizer_json_pre_tokenizer_per_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let bpe = trained(dir.path(), &Pattern::Gpt2);
    let pre = |pattern: Pattern| {
        let bpe = Bpe {
            pattern,
            ..bpe.clone()
        };
        hf::to_json(&bpe).unwrap()["pre_tokenizer"].clone()
    };
    assert_eq!(
        pre(Pattern::Gpt2),
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
    );
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false});
    let split = |regex: &str, behavior: &str, invert: bool| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": behavior, "invert": invert},
            byte_level.clone(),
        ]})
    };
    // Oniguruma reads `{1,3}+` as a repetition: GPT-4's is written without the `+`.
    let gpt4 = Pattern::Gpt4.regex().replace(r"\p{N}{1,3}+", r"\p{N}{1,3}");
    assert_ne!(gpt4, Pattern::Gpt4.regex());
    assert_eq!(pre(Pattern::Gpt4), split(&gpt4, "Isolated", false));
    let o200k = Pattern::O200k.regex().to_string();
    assert_eq!(pre(Pattern::O200k), split(&o200k, "Isolated", false));
    let possessive = Bpe {
        pattern: Pattern::from_regex(r"\p{L}+|\p{N}{1,3}+", false).unwrap(),
        ..bpe.clone()
    };
    let e = err(hf::to_json(&possessive));
    assert!(e.contains("possessive"), "{e}");
    let custom = |gaps| pre(Pattern::from_regex(CUSTOM, gaps).unwrap());
    assert_eq!(custom(false), split(CUSTOM, "Removed", true));
    assert_eq!(custom(true), split(CUSTOM, "Isolated", false));
    let json = hf::to_json(&bpe).unwrap();
    assert_eq!(json["model"]["type"], "BPE");
    assert_eq!(json["model"]["ignore_merges"], false);
    assert_eq!(
        json["added_tokens"][0],
        json!({"id": 256, "content": EOT, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    );
}

/// Writes `json` to `dir/name` and reads it back as a tokenizer, expecting a
/// one-line error that names the file and each of `needles`.
fn refused(dir: &Path, name: &str, json: &Value, needles: &[&str]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, json.to_string()).unwrap();
    let e = err(hf::load(&path));
    assert_one_line_naming(&e, &path, needles);
    e
}

/// Asserts that the error message `e` is one line that names `path` and each of
/// `needles`.
fn assert_one_line_naming(e: &str, path: &Path, needles: &[&str]) {
    assert!(e.contains(&path.display().to_string()), "{e}");
    for needle in needles {
        assert!(e.contains(needle), "{needle}: {e}");
    }
    assert!(!e.contains('\n'), "{e}");
}

#[test]
fn tokenizer_json_errors_name_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let bpe = trained(dir.path(), &Pattern::Gpt4);
    let good = hf::to_json(&bpe).unwrap();
    let with = |pointer: &str, value: Value| {
        let mut j = good.clone();
        *j.pointer_mut(pointer).unwrap() = value;
        j
    };
    // (Where in the file, the value written there, the key the error names, and
    // what else it says.)
    let pattern = "/pre_tokenizer/pretokenizers/0/pattern";
    let mut cases: Vec<(String, Value, String, &str)> = vec![
        (
            "/normalizer".into(),
            json!({"type": "NFC"}),
            "normalizer".into(),
            "NFC",
        ),
        (
            "/pre_tokenizer".into(),
            json!({"type": "Metaspace"}),
            "pre_tokenizer".into(),
            "",
        ),
        (
            pattern.into(),
            json!({"String": " "}),
            "pre_tokenizer.pretokenizers[0].pattern".into(),
            "",
        ),
        (
            "/pre_tokenizer/pretokenizers/0/behavior".into(),
            json!("MergedWithPrevious"),
            "pre_tokenizer.pretokenizers[0].behavior".into(),
            "",
        ),
        (
            "/pre_tokenizer/pretokenizers/1/use_regex".into(),
            json!(true),
            "pre_tokenizer.pretokenizers[1].use_regex".into(),
            "",
        ),
        // tiktoken's own GPT-4 regex means another split to tokenizers.
        (
            format!("{pattern}/Regex"),
            json!(Pattern::Gpt4.regex()),
            "pre_tokenizer.pretokenizers[0].pattern".into(),
            "repetition",
        ),
        (
            format!("{pattern}/Regex"),
            json!("("),
            "pre_tokenizer.pretokenizers[0].pattern".into(),
            "",
        ),
        (
            "/model/merges/3".into(),
            json!("nospace"),
            "model.merges[3]".into(),
            "",
        ),
        (
            "/added_tokens/0/lstrip".into(),
            json!(true),
            "added_tokens[0].lstrip".into(),
            "",
        ),
    ];
    for model in ["WordPiece", "Unigram", "WordLevel"] {
        cases.push((
            "/model/type".into(),
            json!(model),
            "model.type".into(),
            model,
        ));
    }
    for (key, value) in [
        ("byte_fallback", json!(true)),
        ("continuing_subword_prefix", json!("##")),
        ("end_of_word_suffix", json!("</w>")),
        ("ignore_merges", json!(true)),
        ("dropout", json!(0.1)),
    ] {
        cases.push((format!("/model/{key}"), value, format!("model.{key}"), ""));
    }
    for (i, (pointer, value, key, detail)) in cases.into_iter().enumerate() {
        let e = refused(
            dir.path(),
            &format!("{i}.json"),
            &with(&pointer, value),
            &[&key],
        );
        assert!(e.contains(detail), "{pointer}: {e}");
    }
    // An id no token has (here: the id of a token dropped from the vocabulary).
    let mut j = good.clone();
    let vocab = j["model"]["vocab"].as_object_mut().unwrap();
    let spelled = bpe.spelled(300);
    vocab.remove(&spelled);
    refused(dir.path(), "d.json", &j, &["model.vocab", "300"]);
    // Saving a vocabulary where two ids have the same bytes names both.
    let mut dup = bpe.clone();
    dup.vocab[400] = dup.vocab[300].clone();
    let e = err(dup.save(&dir.path().join("dup")));
    assert!(
        e.contains("300") && e.contains("400") && e.contains("tokenizer.json"),
        "{e}"
    );
}

fn specials_at(bpe: &Bpe) -> Vec<(String, Option<u32>)> {
    bpe.special_tokens()
        .into_iter()
        .zip(&bpe.specials)
        .map(|(t, &id)| (t, Some(id)))
        .collect()
}

#[test]
fn rank_files_round_trip_for_each_pattern() {
    let dir = tempfile::tempdir().unwrap();
    for (i, pattern) in patterns().into_iter().enumerate() {
        let trained = trained(dir.path(), &pattern);
        let path = dir.path().join(format!("t{i}.tiktoken"));
        tiktoken::save(&path, &trained).unwrap();
        let bpe = tiktoken::load(&path, pattern.clone(), &specials_at(&trained)).unwrap();
        // The vocabulary, specials and pattern come back; the merges are those the
        // ranks derive, which tinylm's training makes here.
        assert_eq!(bpe.vocab, trained.vocab);
        assert_eq!(bpe.specials, trained.specials);
        assert_eq!(bpe.pattern, pattern);
        let differing = bpe
            .merges
            .iter()
            .zip(&trained.merges)
            .filter(|(a, b)| a != b)
            .count();
        eprintln!(
            "{}: {differing} merges differ from training's",
            pattern.regex()
        );
        // A rank-derived tokenizer round-trips exactly, through a rank file and
        // through tokenizer.json.
        let again = dir.path().join(format!("u{i}.tiktoken"));
        tiktoken::save(&again, &bpe).unwrap();
        assert_eq!(
            std::fs::read(&again).unwrap(),
            std::fs::read(&path).unwrap()
        );
        assert_eq!(
            tiktoken::load(&again, pattern.clone(), &specials_at(&bpe)).unwrap(),
            bpe
        );
        let json = dir.path().join(format!("t{i}.json"));
        hf::save(&json, &bpe).unwrap();
        assert_eq!(hf::load(&json).unwrap(), bpe);
    }
}

#[test]
fn rank_file_special_ids_and_placeholders() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bytes.tiktoken");
    let bytes = Bpe {
        vocab: (0..=255u8).map(|b| vec![b]).collect(),
        merges: vec![],
        specials: vec![],
        pattern: Pattern::Gpt4,
    };
    tiktoken::save(&path, &bytes).unwrap();
    let specials = vec![
        ("<|a|>".to_string(), None),
        ("<|b|>".to_string(), Some(260)),
        ("<|c|>".to_string(), None),
    ];
    let bpe = tiktoken::load(&path, Pattern::Gpt4, &specials).unwrap();
    assert_eq!(bpe.specials, [256, 260, 261]);
    assert_eq!(bpe.vocab.len(), 262);
    assert!(bpe.vocab[257..260].iter().all(Vec::is_empty));
    let tokenizer = bpe.tokenizer().unwrap();
    assert_eq!(
        tokenizer.encode("x<|b|><|c|><|a|>"),
        [b'x' as u32, 260, 261, 256]
    );
    // Placeholders never encode and decode to nothing; tokenizer.json leaves them out
    // and they come back.
    assert_eq!(tokenizer.decode(&[257, b'y' as u32]).unwrap(), "y");
    let json = dir.path().join("t.json");
    hf::save(&json, &bpe).unwrap();
    assert_eq!(hf::load(&json).unwrap(), bpe);
    // A special id inside the ranks.
    let e = err(tiktoken::load(
        &path,
        Pattern::Gpt4,
        &[("<|x|>".to_string(), Some(65))],
    ));
    assert!(e.contains("65") && e.contains("<|x|>"), "{e}");
    let e = err(tiktoken::load(
        &path,
        Pattern::Gpt4,
        &[("<|x|>".into(), Some(300)), ("<|y|>".into(), Some(300))],
    ));
    assert!(e.contains("300") && e.contains("<|y|>"), "{e}");
}

/// An added token's id far above the vocabulary would make as many empty
/// placeholder tokens; a token of `model.vocab` with the id of another, or of an
/// added token, was lost.
#[test]
fn tokenizer_json_ids_leave_few_unused_and_are_one_tokens_each() {
    let dir = tempfile::tempdir().unwrap();
    let bpe = trained(dir.path(), &Pattern::Gpt2);
    let mut far = hf::to_json(&bpe).unwrap();
    let end = bpe.vocab.len() as u64;
    far["added_tokens"][0]["id"] = json!(end + MAX_UNUSED_IDS);
    let path = dir.path().join("far.json");
    std::fs::write(&path, far.to_string()).unwrap();
    assert_eq!(
        hf::load(&path).unwrap().vocab.len() as u64,
        end + MAX_UNUSED_IDS + 1
    );
    far["added_tokens"][0]["id"] = json!(end + MAX_UNUSED_IDS + 1);
    refused(
        dir.path(),
        "far.json",
        &far,
        &["added_tokens", "ids unused"],
    );
    far["added_tokens"][0]["id"] = json!(u32::MAX);
    refused(dir.path(), "far.json", &far, &["ids unused"]);
    // Found by fuzzing (hf_import): an added token given the id of a byte token
    // dropped that token (and the byte's encoding), and its text was another
    // token's, so the file written back lost an id.
    let mut taken = hf::to_json(&bpe).unwrap();
    taken["added_tokens"][0]["id"] = json!(128);
    refused(
        dir.path(),
        "taken.json",
        &taken,
        &[
            "model.vocab",
            "has the id 128 of the added token \"<|endoftext|>\"",
        ],
    );
    let mut twice = hf::to_json(&bpe).unwrap();
    twice["model"]["vocab"]["Ġzzz"] = json!(300);
    refused(
        dir.path(),
        "twice.json",
        &twice,
        &[
            "model.vocab",
            "\"Ġzzz\" has the id 300, which another token has too",
        ],
    );
}

/// A special token's id far above the ranks would make as many empty placeholder
/// tokens (96 GB for the largest `u32`, and `u32::MAX` itself overflowed `id + 1`
/// and indexed past the vocabulary): ids may leave at most `MAX_UNUSED_IDS` unused.
#[test]
fn rank_file_special_ids_leave_few_ids_unused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bytes.tiktoken");
    std::fs::write(&path, byte_lines().join("\n") + "\n").unwrap();
    let unused = MAX_UNUSED_IDS as u32;
    let special = |id| [("<|x|>".to_string(), Some(id))];
    let bpe = tiktoken::load(&path, Pattern::Gpt4, &special(256 + unused)).unwrap();
    assert_eq!(bpe.vocab.len(), 257 + unused as usize);
    for id in [257 + unused, 4_000_000_000, u32::MAX] {
        let e = err(tiktoken::load(&path, Pattern::Gpt4, &special(id)));
        let at = format!("{}: the special tokens' id {id} leaves", path.display());
        assert!(e.contains(&at) && e.contains("ids unused"), "{e}");
    }
    // After a special at the largest id, none is left for the next one.
    let specials = [
        ("<|x|>".to_string(), Some(u32::MAX)),
        ("<|y|>".to_string(), None),
    ];
    let e = err(tiktoken::load(&path, Pattern::Gpt4, &specials));
    assert!(
        e.contains("no id is left for the special token \"<|y|>\""),
        "{e}"
    );
}

/// Writes `lines` as a rank file and loads it, expecting an error naming the file and
/// each of `parts`.
fn rank_error(dir: &Path, lines: &[String], parts: &[&str]) -> String {
    let path = dir.join("bad.tiktoken");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let e = err(tiktoken::load(&path, Pattern::Gpt4, &[]));
    assert_one_line_naming(&e, &path, parts);
    e
}

/// The fuzzer's finding (`fuzz/corpus/tiktoken/found-far-special-id`): 21 byte
/// ranks and a special token at id 60,000 made 59,978 placeholder tokens, 2.9 MB
/// from a 185-byte input, which the cap of unused ids (then 65,536) let through. It
/// is refused now, naming the file, and a special as far as the cap allows is read.
#[test]
fn a_special_id_far_past_few_ranks_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("few.tiktoken");
    std::fs::write(&path, byte_lines()[..21].join("\n") + "\n").unwrap();
    let special = |id| [("<|far|>".to_string(), Some(id))];
    let e = err(tiktoken::load(&path, Pattern::Gpt4, &special(60_000)));
    assert!(
        e.contains(&format!(
            "{}: the special tokens' id 60000 leaves",
            path.display()
        )),
        "{e}"
    );
    let far = 21 + MAX_UNUSED_IDS as u32;
    assert_eq!(
        tiktoken::load(&path, Pattern::Gpt4, &special(far))
            .unwrap()
            .vocab
            .len(),
        far as usize + 1
    );
}

fn byte_lines() -> Vec<String> {
    use base64::Engine;
    (0..=255u8)
        .map(|b| {
            let token = base64::engine::general_purpose::STANDARD.encode([b]);
            format!("{token} {b}")
        })
        .collect()
}

#[test]
fn rank_file_errors_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut lines = byte_lines();
    lines[10] = "not*base64 10".into();
    rank_error(d, &lines, &[":11:", "not*base64"]);
    let mut lines = byte_lines();
    lines[10] = "Cg==".into();
    rank_error(d, &lines, &[":11:", "Cg=="]);
    let mut lines = byte_lines();
    lines[10] = "Cg== ten".into();
    rank_error(d, &lines, &[":11:", "ten"]);
    // Rank 10 twice (lines 11 and 12), so rank 11 is missing too: the repeat is named.
    let mut lines = byte_lines();
    lines[11] = "Cw== 10".into();
    rank_error(d, &lines, &["rank 10", "lines 11 and 12"]);
    // A token twice.
    let mut lines = byte_lines();
    lines.push("AA== 256".into());
    rank_error(d, &lines, &["ranks 0 (line 1) and 256 (line 257)"]);
    // Rank 100 missing.
    let mut lines = byte_lines();
    lines.remove(100);
    rank_error(d, &lines, &["rank 100"]);
    // "abc" with neither "ab" nor "bc" ranked below it.
    let mut lines = byte_lines();
    lines.push("YWJj 256".into());
    rank_error(d, &lines, &[":257:", "\"abc\"", "rank 256", "3 parts"]);
}

#[test]
fn python_snippet_spells_the_pattern_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let bpe = trained(dir.path(), &Pattern::Gpt2);
    let regexes = [
        Pattern::Gpt2.regex().to_string(),
        Pattern::Gpt4.regex().to_string(),
        Pattern::O200k.regex().to_string(),
        r#"'s|"[^"]*"|\p{L}+"#.to_string(),
        r#"'''|"""|\p{L}+"#.to_string(),
        r"\p{L}+|[\\]".to_string(),
        "\\p{L}+|\t|\\n".to_string(),
    ];
    let python = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    for regex in regexes {
        let bpe = Bpe {
            pattern: Pattern::from_regex(&regex, false).unwrap(),
            ..bpe.clone()
        };
        let snippet = tiktoken::python_snippet(Path::new("/x/tok.tiktoken"), &bpe);
        assert!(snippet.contains("import tiktoken"), "{snippet}");
        assert!(
            snippet.contains(&format!(
                "special_tokens={{r\"{EOT}\": 256, r\"<|pad|>\": 257}}"
            )),
            "{snippet}"
        );
        let line = snippet
            .lines()
            .find_map(|l| l.trim().strip_prefix("pat_str="))
            .unwrap()
            .trim_end_matches(',');
        if python {
            let out = std::process::Command::new("python3")
                .args(["-c", &format!("import sys; sys.stdout.write({line})")])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{line}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(String::from_utf8(out.stdout).unwrap(), regex, "{line}");
        }
    }
}

#[test]
fn cl100k_base_round_trips_byte_for_byte() {
    let assets = published::assets();
    let dir = tempfile::tempdir().unwrap();
    let original = assets.join("cl100k_base.tiktoken");
    let specials = [("<|endoftext|>".to_string(), Some(100257))];
    let bpe = tiktoken::load(&original, Pattern::Gpt4, &specials).unwrap();
    let path = dir.path().join("cl100k_base.tiktoken");
    tiktoken::save(&path, &bpe).unwrap();
    assert!(std::fs::read(&path).unwrap() == std::fs::read(&original).unwrap());
    bpe.save(&dir.path().join("tok")).unwrap();
    assert_eq!(Bpe::load(&dir.path().join("tok")).unwrap(), bpe);
}
