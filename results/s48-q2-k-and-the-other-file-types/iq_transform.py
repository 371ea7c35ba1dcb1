"""39o: IQ dot products (vec_dot, 1-7 rows) add each block as the tiled matmul does (8+ rows)."""
import sys
path = sys.argv[1]
src = open(path).read()

def avx2_region(fn):
    start = src.index(f"void {fn}(")
    a = src.index("#if defined(__AVX2__)", start) if "#if defined(__AVX2__)" in src[start:start + 3000] else src.index("#if defined __AVX2__", start)
    b = min(i for i in (src.find("#elif defined(__AVX__)", a), src.find("#elif defined __AVX__", a)) if i > 0)
    return a, b

def edit(fn, pairs):
    global src
    a, b = avx2_region(fn)
    region = src[a:b]
    for old, new in pairs:
        assert region.count(old) == 1, (fn, old, region.count(old))
        region = region.replace(old, new)
    src = src[:a] + region + src[b:]

TILED = "        // the block added as the tiled matmul does (ggml_kquant_block_add){}\n"
for fn, factor in (("ggml_vec_dot_iq2_xxs_q8_K", "0.125f"), ("ggml_vec_dot_iq2_xs_q8_K", "0.125f"),
                   ("ggml_vec_dot_iq2_s_q8_K", "0.125f"), ("ggml_vec_dot_iq3_xxs_q8_K", "0.25f"),
                   ("ggml_vec_dot_iq3_s_q8_K", None)):
    d0 = "GGML_CPU_FP16_TO_FP32(x[i].d)" + (f" * {factor}" if factor else "")
    edit(fn, [
        ("    __m256 accumf = _mm256_setzero_ps();\n", "    __m128 accumf = _mm_setzero_ps();\n"),
        ("        const float d = GGML_CPU_FP16_TO_FP32(x[i].d) * y[i].d;\n", ""),
        ("        accumf = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(sumi1, sumi2)), accumf);\n",
         TILED.format(f", its d0 the block's scale times {factor} as there" if factor else "")
         + f"        accumf = ggml_kquant_block_add(accumf, _mm256_add_epi32(sumi1, sumi2), {d0}, y[i].d);\n"),
        (f"    *s = {factor + ' * ' if factor else ''}hsum_float_8(accumf);\n", "    *s = _mm_cvtss_f32(accumf);\n"),
    ])

# IQ1_S and IQ1_M: the tiled kernel codes each value as 8 * grid + delta, so a block's integer sum is 8 times the
# grid part plus the delta part, scaled by d / 8 (IQ1S_DELTA = IQ1M_DELTA = 1/8)
edit("ggml_vec_dot_iq1_s_q8_K", [
    ("    __m256 accum = _mm256_setzero_ps();\n    float accum1 = 0;\n", "    __m128 accum = _mm_setzero_ps();\n"),
    ("        const float d = y[i].d * GGML_CPU_FP16_TO_FP32(x[i].d);\n"
     "        accum = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), accum);\n"
     "        accum1 += d * sumi1;\n",
     "        // the block added as the tiled matmul does (ggml_kquant_block_add): its codes are 8 * grid + delta,\n"
     "        // so its integer sum is 8 * sumi + sumi1, its d0 the block's scale / 8 (IQ1S_DELTA)\n"
     "        const __m256i total = _mm256_add_epi32(_mm256_slli_epi32(sumi, 3), _mm256_setr_epi32(sumi1, 0, 0, 0, 0, 0, 0, 0));\n"
     "        accum = ggml_kquant_block_add(accum, total, GGML_CPU_FP16_TO_FP32(x[i].d) * 0.125f, y[i].d);\n"),
    ("    *s = hsum_float_8(accum) + IQ1S_DELTA * accum1;\n", "    *s = _mm_cvtss_f32(accum);\n"),
])
edit("ggml_vec_dot_iq1_m_q8_K", [
    ("    __m256 accum1 = _mm256_setzero_ps();\n    __m256 accum2 = _mm256_setzero_ps();\n", "    __m128 accum = _mm_setzero_ps();\n"),
    ("        const __m256 d = _mm256_set1_ps(y[i].d * GGML_CPU_FP16_TO_FP32(scale.f16));\n\n"
     "        accum1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi1), accum1);\n"
     "        accum2 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi2), accum2);\n",
     "        // the block added as the tiled matmul does (ggml_kquant_block_add): its codes are 8 * grid + delta,\n"
     "        // so its integer sum is 8 * sumi1 + sumi2, its d0 the block's scale / 8 (IQ1M_DELTA)\n"
     "        accum = ggml_kquant_block_add(accum, _mm256_add_epi32(_mm256_slli_epi32(sumi1, 3), sumi2),\n"
     "                                      GGML_CPU_FP16_TO_FP32(scale.f16) * 0.125f, y[i].d);\n"),
    ("    *s = hsum_float_8(accum1) + IQ1M_DELTA * hsum_float_8(accum2);\n", "    *s = _mm_cvtss_f32(accum);\n"),
])
open(path, "w").write(src)
print("ok")
