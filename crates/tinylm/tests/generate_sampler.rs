//! Sampling: greedy, temperature, top-k and the smallest top-p nucleus, on hand-made
//! distributions; streaming UTF-8 decoding of generated ids; stop strings.

use tinylm::generate::{argmax, Sampler, StopText, TextStream};
use tinylm_bpe::encode::Tokenizer;

/// Logits whose softmax is `probs` (up to rounding).
fn logits_of(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

/// The kept ids and their renormalized probabilities.
fn kept(top_p: f32, top_k: Option<usize>, probs: &[f32]) -> Vec<(u32, f32)> {
    let mut s = Sampler::new(1.0, top_p, top_k, 0).unwrap();
    s.distribution(&logits_of(probs))
}

fn ids(dist: &[(u32, f32)]) -> Vec<u32> {
    dist.iter().map(|&(id, _)| id).collect()
}

fn assert_probs(dist: &[(u32, f32)], want: &[f32]) {
    assert_eq!(dist.len(), want.len(), "{dist:?} vs {want:?}");
    for (&(id, p), &w) in dist.iter().zip(want) {
        assert!((p - w).abs() < 1e-5, "id {id}: {p} vs {w} in {dist:?}");
    }
}

#[test]
fn top_p_keeps_the_smallest_nucleus() {
    // Ids in shuffled order: ranking is by probability, never by position.
    let probs = [0.1, 0.2, 0.5, 0.2];
    // 0.5 alone reaches 0.5.
    assert_eq!(ids(&kept(0.5, None, &probs)), [2]);
    assert_eq!(ids(&kept(0.3, None, &probs)), [2]);
    // Just above 0.5 needs a second token; of the tied 0.2s the lower id comes first.
    assert_eq!(ids(&kept(0.51, None, &probs)), [2, 1]);
    assert_eq!(ids(&kept(0.7, None, &probs)), [2, 1]);
    assert_renormalized(&kept(0.7, None, &probs), &[0.5 / 0.7, 0.2 / 0.7]);
    assert_eq!(ids(&kept(0.71, None, &probs)), [2, 1, 3]);
    assert_eq!(ids(&kept(0.9, None, &probs)), [2, 1, 3]);
    assert_eq!(ids(&kept(0.91, None, &probs)), [2, 1, 3, 0]);
    // p = 1 keeps everything, the plain softmax.
    let all = kept(1.0, None, &probs);
    assert_eq!(all.len(), 4);
    let mut by_id = all.clone();
    by_id.sort_by_key(|&(id, _)| id);
    assert_probs(&by_id, &probs);
}

fn assert_renormalized(dist: &[(u32, f32)], want: &[f32]) {
    assert_probs(dist, want);
    let sum: f32 = dist.iter().map(|&(_, p)| p).sum();
    assert!((sum - 1.0).abs() < 1e-6);
}

#[test]
fn top_p_with_all_ties_and_a_dominant_token() {
    let uniform = [0.25; 4];
    assert_eq!(ids(&kept(0.5, None, &uniform)), [0, 1]);
    assert_eq!(ids(&kept(0.75, None, &uniform)), [0, 1, 2]);
    assert_eq!(ids(&kept(0.76, None, &uniform)), [0, 1, 2, 3]);
    assert_renormalized(&kept(0.5, None, &uniform), &[0.5, 0.5]);
    let peaked = [0.001, 0.997, 0.001, 0.001];
    assert_eq!(ids(&kept(0.99, None, &peaked)), [1]);
    assert_renormalized(&kept(0.99, None, &peaked), &[1.0]);
}

#[test]
fn top_k_then_top_p_of_the_renormalized_rest() {
    let probs = [0.4, 0.3, 0.2, 0.1];
    assert_eq!(ids(&kept(1.0, Some(2), &probs)), [0, 1]);
    assert_renormalized(&kept(1.0, Some(2), &probs), &[4.0 / 7.0, 3.0 / 7.0]);
    // Within the top 2, 0.4/0.7 ≈ 0.571 reaches 0.55 alone.
    assert_eq!(ids(&kept(0.55, Some(2), &probs)), [0]);
    assert_eq!(ids(&kept(0.6, Some(2), &probs)), [0, 1]);
    assert_eq!(kept(1.0, Some(10), &probs).len(), 4);
}

#[test]
fn temperature_scales_the_logits() {
    let logits = [1.0f32, 2.0, -0.5, 3.0];
    for t in [0.5f32, 1.0, 2.0] {
        let mut s = Sampler::new(t, 1.0, None, 0).unwrap();
        let mut dist = s.distribution(&logits);
        dist.sort_by_key(|&(id, _)| id);
        let e: Vec<f64> = logits.iter().map(|&l| ((l / t) as f64).exp()).collect();
        let z: f64 = e.iter().sum();
        let want: Vec<f32> = e.iter().map(|x| (x / z) as f32).collect();
        assert_probs(&dist, &want);
    }
}

#[test]
fn temperature_zero_is_greedy() {
    let logits = [0.3f32, 5.0, 5.0, -1.0, 4.9];
    assert_eq!(argmax(&logits), 1, "ties go to the lowest id");
    for seed in 0..20 {
        let mut s = Sampler::new(0.0, 0.5, Some(3), seed).unwrap();
        assert_eq!(s.sample(&logits), 1);
    }
    assert_eq!(
        Sampler::greedy().sample(&[f32::NEG_INFINITY, -3.0, -2.0]),
        2
    );
}

/// The nucleus of a large vocabulary — of a few tokens, or of hundreds (past the
/// part the sampler sorts rather than halves) — with and without top-k, equals the
/// one of the whole vocabulary sorted, in the same order.
#[test]
fn the_nucleus_of_a_large_vocabulary_is_that_of_the_whole_sort() {
    // 5,000 logits spread over 6 nats, with ties (values on a grid).
    let logits: Vec<f32> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) % 600) as f32 / 100.0)
        .collect();
    for (top_p, top_k) in [
        (0.01, None),
        (0.3, None),
        (0.9, None),
        (0.999, None),
        (0.9, Some(700)),
        (1.0, Some(300)),
        (0.5, Some(1)),
    ] {
        let mut s = Sampler::new(1.0, top_p, top_k, 0).unwrap();
        let got = s.distribution(&logits);
        // The reference: every token sorted, top-k, then the smallest prefix whose
        // sum reaches top_p of what top-k kept.
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut all: Vec<(u32, f32)> = (0u32..)
            .zip(&logits)
            .map(|(id, &l)| (id, (l - max).exp()))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(top_k.unwrap_or(all.len()));
        let total: f64 = all.iter().map(|&(_, p)| p as f64).sum();
        let mut sum = 0.0;
        let n = all
            .iter()
            .position(|&(_, p)| {
                sum += p as f64;
                sum >= top_p as f64 * total * (1.0 - 1e-6)
            })
            .map_or(all.len(), |i| i + 1);
        let want = &all[..n];
        assert_eq!(ids(&got), ids(want), "top_p {top_p}, top_k {top_k:?}");
        let kept: f64 = want.iter().map(|&(_, p)| p as f64).sum();
        let want: Vec<f32> = want
            .iter()
            .map(|&(_, p)| (p as f64 / kept) as f32)
            .collect();
        assert_probs(&got, &want);
    }
}

#[test]
fn samples_follow_the_truncated_distribution() {
    let probs = [0.1, 0.2, 0.5, 0.2];
    let logits = logits_of(&probs);
    let mut s = Sampler::new(1.0, 0.75, None, 7).unwrap();
    let n = 40_000;
    let mut counts = [0usize; 4];
    for _ in 0..n {
        counts[s.sample(&logits) as usize] += 1;
    }
    // Nucleus {2, 1, 3} renormalized by 0.9; id 0 never drawn.
    assert_eq!(counts[0], 0);
    for (id, p) in [(2, 0.5 / 0.9), (1, 0.2 / 0.9), (3, 0.2 / 0.9)] {
        let f = counts[id] as f64 / n as f64;
        // 5 standard deviations of a binomial proportion.
        let sd = (p * (1.0 - p) / n as f64).sqrt();
        assert!((f - p).abs() < 5.0 * sd, "id {id}: {f} vs {p}");
    }
}

#[test]
fn sampling_is_deterministic_under_a_seed() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
    let draw = |seed| {
        let mut s = Sampler::new(0.9, 0.95, Some(30), seed).unwrap();
        (0..100).map(|_| s.sample(&logits)).collect::<Vec<u32>>()
    };
    assert_eq!(draw(3), draw(3));
    assert_ne!(draw(3), draw(4));
}

#[test]
fn bad_settings_are_rejected() {
    for (t, p, k) in [
        (-0.1, 0.9, None),
        (f32::NAN, 0.9, None),
        (1.0, 0.0, None),
        (1.0, 1.5, None),
        (1.0, f32::NAN, None),
        (1.0, 0.9, Some(0)),
    ] {
        let err = Sampler::new(t, p, k, 0).unwrap_err().to_string();
        assert!(err.contains("must"), "{err}");
    }
}

#[test]
fn text_stream_prints_only_complete_utf8() {
    // Bytes 0..=255 as single tokens, so a character can be split across tokens.
    let vocab: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let tok = Tokenizer::new(vocab, &Vec::new(), &[]).unwrap();
    let text = "a€b😀";
    let mut stream = TextStream::new(&tok);
    let mut pieces = Vec::new();
    for &b in text.as_bytes() {
        pieces.push(stream.push(b as u32).unwrap());
    }
    assert_eq!(pieces, ["a", "", "", "€", "b", "", "", "", "😀"]);
    assert_eq!(stream.finish(), "");
    // Malformed bytes become U+FFFD as in decode; an unfinished tail at the end too.
    let mut stream = TextStream::new(&tok);
    let out: String = [0xFFu32, b'x' as u32, 0xE2]
        .iter()
        .map(|&id| stream.push(id).unwrap())
        .collect();
    assert_eq!(out + &stream.finish(), "\u{FFFD}x\u{FFFD}");
    assert!(TextStream::new(&tok).push(256).is_err());
}

#[test]
fn a_vocabulary_limit_never_draws_the_ids_above_it() {
    // The most probable ids lie above the limit: only 0..3 may come out.
    let logits = [0.0f32, 0.5, 0.2, 9.0, 9.0];
    assert_eq!(Sampler::greedy().vocabulary(3).sample(&logits), 1);
    for seed in 0..50 {
        let mut s = Sampler::new(1.0, 1.0, None, seed).unwrap().vocabulary(3);
        assert!(s.sample(&logits) < 3);
    }
    // Without the limit the same sampler draws them.
    assert_eq!(Sampler::greedy().sample(&logits), 3);
}

/// Stop strings cut the text before the first of them, even when they arrive split
/// over pieces; text that only looks like a stop string's start comes out when the
/// next piece rules it out.
#[test]
fn stop_text_cuts_before_the_first_stop_string_across_pieces() {
    let run = |stops: &[&str], pieces: &[&str]| {
        let mut stop = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut shown = Vec::new();
        for piece in pieces {
            let (text, stopped) = stop.push(piece);
            shown.push(text);
            if stopped {
                return (shown, true);
            }
        }
        shown.push(stop.finish());
        (shown, false)
    };
    let (shown, stopped) = run(
        &["\n\n", "The end"],
        &["Once", " upon\n", "a time\n", "\nmore"],
    );
    assert!(stopped);
    assert_eq!(shown, ["Once", " upon", "\na time", ""]);
    let (shown, stopped) = run(&["The end"], &["It was The", " en", "try. The e", "nd!"]);
    assert!(stopped);
    assert_eq!(shown, ["It was ", "", "The entry. ", ""]);
    assert_eq!(shown.concat(), "It was The entry. ");
    // The earliest stop wins, wherever it is in the list; no stop: everything.
    let (shown, _) = run(&["c", "ab"], &["xxabc"]);
    assert_eq!(shown, ["xx"]);
    let (shown, stopped) = run(&["zz", ""], &["héllo z", "é"]);
    assert!(!stopped);
    assert_eq!(shown.concat(), "héllo zé");
}
