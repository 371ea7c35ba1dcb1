"""39n (second half): vec_dot_q2_K_q8_K adds each block as the tiled matmul does (where Q2_K is not repacked: AVX2 alone)."""
import sys
path = sys.argv[1]
src = open(path).read()
start = src.index("void ggml_vec_dot_q2_K_q8_K(")
a = src.index("#if defined __AVX2__", start)
b = src.index("#elif defined __AVX__", a)
region = src[a:b]
for old, new in [
    ("    __m256 acc = _mm256_setzero_ps();\n", "    __m128 acc = _mm_setzero_ps();\n"),
    ("        const float d = y[i].d * GGML_CPU_FP16_TO_FP32(x[i].d);\n"
     "        const float dmin = -y[i].d * GGML_CPU_FP16_TO_FP32(x[i].dmin);\n\n", ""),
    ("        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(&dmin), _mm256_cvtepi32_ps(prod), acc);\n\n", ""),
    ("        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(&d), _mm256_cvtepi32_ps(sumi), acc);\n",
     "        // the block added as the tiled matmul does (ggml_kquant_block_add_min; the mins' 8 sums folded to 4)\n"
     "        acc = ggml_kquant_block_add_min(acc, sumi,\n"
     "                _mm_add_epi32(_mm256_castsi256_si128(prod), _mm256_extracti128_si256(prod, 1)),\n"
     "                GGML_CPU_FP16_TO_FP32(x[i].d), GGML_CPU_FP16_TO_FP32(x[i].dmin), y[i].d);\n"),
    ("    *s = hsum_float_8(acc);\n", "    *s = _mm_cvtss_f32(acc);\n"),
]:
    assert region.count(old) == 1, (old, region.count(old))
    region = region.replace(old, new)
open(path, "w").write(src[:a] + region + src[b:])
print("ok")
