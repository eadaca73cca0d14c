//! The bf16 products against their definition: the same inputs rounded to bf16 by
//! `half` (nearest, ties to even), multiplied and summed in f64. Every kernel this
//! CPU runs — the portable one always, the native one (AVX512_BF16 or Arm BF16)
//! where the CPU has it — in every product form, on shapes that end inside every
//! blocking dimension.
//!
//! The bound: each output is a chain of `k` (or `k + 1`, accumulating) `f32`
//! additions of exact bf16 products, so `|c − ref| ≤ (k + 1) · 2⁻²³ · (Σ|aᵢ·bᵢ| +
//! |c₀|)` — one `f32` unit in the last place (2⁻²³ relative) per addition, which
//! covers round-to-nearest (half of it) and the round-to-odd of Arm's `bfdot`.
//! Rounding the inputs by truncation instead errs by up to 2⁻⁷ relative per input
//! and fails it ([`rounding_is_to_nearest_even_in_every_operand`] pins it exactly).

// Each test file uses some of the shared helpers.
#[allow(dead_code)]
mod cpu;

use cpu::expected_native_bf16;
use half::bf16;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tinylm::kernels::cpu::bf16::matmul::MAX_PACKED_B;
use tinylm::kernels::cpu::bf16::{matmul_bf16_on, matmul_bf16_view, Bf16Kernel, Operand};
use tinylm::kernels::MatMul;

/// The kernels this CPU runs: the portable one, and the native one where the CPU's
/// features call for it — asserted, so that a detection that fell back to the
/// portable kernel fails here rather than test only that one (`tests/dispatch.rs`
/// says why the features come from outside the program).
fn kernels() -> Vec<Bf16Kernel> {
    let native = Bf16Kernel::native();
    assert_eq!(native, expected_native_bf16(), "the native bf16 kernel");
    std::iter::once(Bf16Kernel::Portable)
        .chain(native)
        .collect()
}

/// Asserts that `got`, a chain of `f32` additions of the exact `terms` to `start`, is
/// within the bound above of their sum in `f64`; `what` names the output.
fn assert_within_bound(
    got: f32,
    start: f64,
    terms: impl Iterator<Item = f64>,
    what: std::fmt::Arguments,
) {
    let (want, magnitude, k) = terms.fold((start, start.abs(), 0), |(s, m, k), x| {
        (s + x, m + x.abs(), k + 1)
    });
    let bound = (k + 1) as f64 * 2f64.powi(-23) * magnitude;
    let got = f64::from(got);
    assert!(
        (got - want).abs() <= bound,
        "{what}: {got} against {want}, bound {bound:.2e}"
    );
}

fn random(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect()
}

/// The five forms: the linear layer's three, attention's `P V`, and both operands
/// transposed.
fn forms(m: usize, k: usize, n: usize) -> [MatMul; 5] {
    [
        MatMul::linear(m, k, n),
        MatMul::linear_dx(m, n, k),
        MatMul::linear_dw(k, n, m),
        MatMul::plain(m, k, n),
        MatMul {
            a_transposed: true,
            b_transposed: true,
            ..MatMul::plain(m, k, n)
        },
    ]
}

/// Checks `kernel`'s product of random operands against the reference at every
/// output (or every `stride`-th row and column), written and accumulated.
fn check(kernel: Bf16Kernel, s: MatMul, rng: &mut ChaCha8Rng, stride: usize) {
    let (m, k, n) = (s.m, s.k, s.n);
    let a = random(rng, m * k);
    let b = random(rng, k * n);
    let c0 = random(rng, m * n);
    let round = |x: f32| f64::from(bf16::from_f32(x).to_f32());
    let at = |i: usize, p: usize| {
        round(if s.a_transposed {
            a[p * m + i]
        } else {
            a[i * k + p]
        })
    };
    let bt = |p: usize, j: usize| {
        round(if s.b_transposed {
            b[j * k + p]
        } else {
            b[p * n + j]
        })
    };
    // `B` also stored in bf16, as a weight's copy is: a linear layer's product of few
    // rows takes the dot-product path then.
    let b16: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
    // Each also as a forward-only model multiplies (more rows as dot products).
    let runs = [(false, false), (true, false), (false, true), (true, true)];
    for (forward, (accumulate, b_in_bf16)) in
        [false, true].into_iter().flat_map(|f| runs.map(|r| (f, r)))
    {
        let s = MatMul { accumulate, ..s };
        let mut out = if accumulate {
            c0.clone()
        } else {
            vec![f32::NAN; m * n]
        };
        match b_in_bf16 {
            false => matmul_bf16_on(kernel, forward, &mut out, &a, &b, s),
            true => matmul_bf16_on(kernel, forward, &mut out, &a, &b16, s),
        }
        for i in (0..m).step_by(stride) {
            for j in (0..n).step_by(stride) {
                let start = if accumulate {
                    f64::from(c0[i * n + j])
                } else {
                    0.0
                };
                assert_within_bound(
                    out[i * n + j],
                    start,
                    (0..k).map(|p| at(i, p) * bt(p, j)),
                    format_args!(
                        "{} {s:?}, B in bf16: {b_in_bf16}, forward only: {forward}, ({i}, {j})",
                        kernel.name()
                    ),
                );
            }
        }
    }
}

/// Shapes that end inside every blocking dimension of every kernel: tiles (`MR` 4 or
/// 8 rows, `NR` 12, 16 or 32 columns), `k` blocks of 512 (`k` odd and even), blocks
/// of 256 rows, single rows, columns and values, and empty products (`k = 0` writes
/// zeros); few rows (at most 16, or 128 in a forward-only model's linear layer:
/// the dot-product path of a bf16 weight, whose blocks are 4 rows by 4 weight rows
/// by 32 values of `k`), split across threads or not, and the first row counts
/// past them.
#[test]
fn products_equal_the_rounded_definition_on_edge_shapes() {
    let mut rng = ChaCha8Rng::seed_from_u64(46);
    let shapes = [
        (0, 4, 5),
        (2, 0, 3),
        (1, 1, 1),
        (3, 2, 5),
        (7, 3, 13),
        (8, 256, 48),
        (9, 257, 49),
        (4, 255, 16),
        (17, 513, 97),
        (16, 1025, 33),
        (12, 1, 12),
        (33, 600, 11),
        (263, 20, 50),
        (1, 768, 131),
        (5, 63, 7),
        (6, 700, 402),
        (1, 2050, 701),
        (17, 33, 9),
        (128, 70, 9),
        (129, 70, 9),
    ];
    for kernel in kernels() {
        for &(m, k, n) in &shapes {
            for s in forms(m, k, n) {
                check(kernel, s, &mut rng, 1);
            }
        }
    }
}

/// Products large enough to split across threads, column blocks and row blocks,
/// and one whose `B` is packed in several chunks of `k` (more than `MAX_PACKED_B`).
#[test]
fn large_products_split_across_threads_equal_the_rounded_definition() {
    let mut rng = ChaCha8Rng::seed_from_u64(47);
    for kernel in kernels() {
        for s in forms(150, 300, 1100) {
            check(kernel, s, &mut rng, 7);
        }
        check(
            kernel,
            MatMul::linear_dx(3, 1024, 4 * MAX_PACKED_B / 1024 + 9),
            &mut rng,
            5,
        );
    }
}

/// Values exactly between or near two bf16 neighbours, in `A` and then in `B` (ones in
/// the other), in every form: the sums are exact, so the product is exactly the sum
/// of the nearest-even roundings. Truncation (or ties away from zero) gives other sums.
#[test]
fn rounding_is_to_nearest_even_in_every_operand() {
    let step = 2f32.powi(-7); // bf16's spacing in [1, 2)
                              // (value, its nearest-even bf16): above half (truncation keeps 1), a tie to the
                              // even 1, a tie to the even 1 + 2·step.
    let values = [
        (1.0 + 0.75 * step, 1.0 + step),
        (1.0 + 0.5 * step, 1.0),
        (1.0 + 1.5 * step, 1.0 + 2.0 * step),
    ];
    let (m, k, n) = (9, 21, 50);
    for kernel in kernels() {
        for s in forms(m, k, n) {
            for tricky_in_a in [true, false] {
                let tricky = |len: usize| (0..len).map(|i| values[i % 3].0).collect::<Vec<f32>>();
                let rounded = |i: usize| values[i % 3].1;
                let (a, b) = if tricky_in_a {
                    (tricky(m * k), vec![1.0; k * n])
                } else {
                    (vec![1.0; m * k], tricky(k * n))
                };
                let mut out = vec![0.0; m * n];
                matmul_bf16_on(kernel, false, &mut out, &a, &b, s);
                for i in 0..m {
                    for j in 0..n {
                        let want: f32 = (0..k)
                            .map(|p| match (tricky_in_a, s.a_transposed, s.b_transposed) {
                                (true, false, _) => rounded(i * k + p),
                                (true, true, _) => rounded(p * m + i),
                                (false, _, true) => rounded(j * k + p),
                                (false, _, false) => rounded(p * n + j),
                            })
                            .sum();
                        assert_eq!(out[i * n + j], want, "{} {s:?} ({i}, {j})", kernel.name());
                    }
                }
            }
        }
    }
}

/// Operands already in bf16 multiply as the same values rounded from `f32` do.
#[test]
fn bf16_operands_give_the_products_of_their_f32_originals() {
    let mut rng = ChaCha8Rng::seed_from_u64(48);
    let (m, k, n) = (37, 131, 70);
    for kernel in kernels() {
        for s in forms(m, k, n) {
            let a = random(&mut rng, m * k);
            let b = random(&mut rng, k * n);
            let a16: Vec<bf16> = a.iter().map(|&x| bf16::from_f32(x)).collect();
            let b16: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
            let (mut from_f32, mut from_bf16) = (vec![0.0; m * n], vec![0.0; m * n]);
            matmul_bf16_on(kernel, false, &mut from_f32, &a, &b, s);
            matmul_bf16_on(kernel, false, &mut from_bf16, &a16, &b16, s);
            assert_eq!(from_f32, from_bf16, "{} {s:?}", kernel.name());
        }
    }
}

/// Attention's per-head products over views of the fused `(T, 3C)` rows: scores `Q Kᵀ`
/// (both contiguous along `D`) and `P V` (`V` contiguous along the head's channels),
/// into an output whose rows are wider than the product.
#[test]
fn strided_views_multiply_as_attention_reads_them() {
    let mut rng = ChaCha8Rng::seed_from_u64(49);
    // 37 positions (blocked products), and 5, 4, 3 and 1 (a decoding step's few
    // rows of `Q` against the keys, as dot products; at most 4 rows of `P` against
    // the values, pair by pair of their rows, `t` even and odd).
    for t in [37, 5, 4, 3, 1] {
        strided_views_of(t, &mut rng);
    }
}

fn strided_views_of(t: usize, rng: &mut ChaCha8Rng) {
    let (c, d, h) = (96, 32, 1); // head h of C / D heads
    let qkv = random(rng, t * 3 * c);
    let round = |x: f32| f64::from(bf16::from_f32(x).to_f32());
    let (q, k, v) = (h * d, c + h * d, 2 * c + h * d); // offsets of the head's Q, K, V
    let p = random(rng, t * t);
    for kernel in kernels() {
        let ldc = t.max(d) + 3; // rows wider than either product
        let mut scores = vec![f32::NAN; t * ldc];
        let mut out = vec![f32::NAN; t * ldc];
        unsafe {
            let q_rows = Operand {
                ptr: qkv[q..].as_ptr(),
                rs: 3 * c,
                cs: 1,
            };
            let k_cols = Operand {
                ptr: qkv[k..].as_ptr(),
                rs: 1,
                cs: 3 * c,
            };
            matmul_bf16_view(
                kernel,
                (t, d, t),
                scores.as_mut_ptr(),
                ldc,
                q_rows,
                k_cols,
                false,
            );
            let p_rows = Operand {
                ptr: p.as_ptr(),
                rs: t,
                cs: 1,
            };
            let v_rows = Operand {
                ptr: qkv[v..].as_ptr(),
                rs: 3 * c,
                cs: 1,
            };
            matmul_bf16_view(
                kernel,
                (t, t, d),
                out.as_mut_ptr(),
                ldc,
                p_rows,
                v_rows,
                false,
            );
        }
        for i in 0..t {
            for j in 0..t {
                let terms =
                    (0..d).map(|e| round(qkv[i * 3 * c + q + e]) * round(qkv[j * 3 * c + k + e]));
                assert_within_bound(
                    scores[i * ldc + j],
                    0.0,
                    terms,
                    format_args!("{} Q·Kᵀ ({i}, {j})", kernel.name()),
                );
            }
            for e in 0..d {
                let terms = (0..t).map(|j| round(p[i * t + j]) * round(qkv[j * 3 * c + v + e]));
                assert_within_bound(
                    out[i * ldc + e],
                    0.0,
                    terms,
                    format_args!("{} P·V ({i}, {e})", kernel.name()),
                );
            }
            // Outside the product, the output's rows are untouched.
            assert!(scores[i * ldc + t..(i + 1) * ldc]
                .iter()
                .all(|x| x.is_nan()));
        }
    }
}
