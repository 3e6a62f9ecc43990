// Include FIRST (before any other header) in every migrate/ source whose float results
// must be bit-identical to ggml's: forbids fusing a*b+c into one FMA, which GCC does by
// default (-ffp-contract=fast) as soon as the target has FMA (-march=native, x86-64-v3),
// and clang does within one expression. libggml-base is built without FMA, so its
// `x0*d + m` rounds twice; so must ours. Everything else (vectorization, -O3) is fine:
// the reference code uses no reductions whose order a compiler may change without
// -ffast-math, which kvsnap never uses.
#pragma once

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
