"""39n: the q2_K 8x8 GEMM keeps each row's integer sums over a super block and scales them once (as 39i for q4_K)."""
import re, sys
path = sys.argv[1]
src = open(path).read().split("\n")
start = next(i for i, l in enumerate(src) if l.startswith("void ggml_gemm_q2_K_8x8_q8_K("))
end = next(i for i in range(start, len(src)) if src[i] == "}")
body = src[start:end + 1]
FMA = re.compile(r"^(\s*)acc_(min_)?rows\[([^\]]*)\] = _mm(512|256)_fmadd_ps\(_mm\4_cvtepi32_ps\((iacc_row_(?:min_)?\d)\), (.*)$")
out, region = [], None
regions = 0
i = 0
while i < len(body):
    l = body[i]
    if l.strip() == "for (int64_t b = 0; b < nb; b++) {":
        # which width and row count: look ahead for the first fmadd in this super-block loop
        j = i
        while not FMA.match(body[j]):
            j += 1
        m = FMA.match(body[j])
        width, rows = m.group(4), (16 if "rp" in m.group(3) else 4)
        region = {"width": width, "rows": rows, "fmas": [], "load": []}
        regions += 1
        ind = l[: len(l) - len(l.lstrip())] + "    "
        si = "__m512i" if width == "512" else "__m256i"
        zero = "_mm512_setzero_si512()" if width == "512" else "_mm256_setzero_si256()"
        out += [l,
                f"{ind}// Integer sums of each row over the whole super block, scaled once after it as the GEMV does",
                f"{ind}{si} iacc_b_rows[{rows}];", f"{ind}{si} iacc_b_min_rows[{rows}];",
                f"{ind}for (int i = 0; i < {rows}; i++) {{",
                f"{ind}    iacc_b_rows[i] = {zero};", f"{ind}    iacc_b_min_rows[i] = {zero};", f"{ind}}}", ""]
        i += 1
        continue
    if region is not None:
        s = l.strip()
        if s.startswith("// Load the scale(d) values for all the 4 Q8_k blocks") or s.startswith("// Multiply with appropi") or s.startswith("// Multiply with appropri"):
            i += 1
            continue
        if re.match(r"const __m(128|256|512) row_scale_f32(_sse|_ymm)? = ", s):
            region["load"].append(s)
            i += 1
            continue
        m = FMA.match(l)
        if m:
            lead, mn, idx, w, iacc, rest = m.groups()
            mn = mn or ""
            out.append(f"{lead}iacc_b_{mn}rows[{idx}] = _mm{w}_add_epi32(iacc_b_{mn}rows[{idx}], {iacc});")
            region["fmas"].append(f"acc_{mn}rows[{idx}] = _mm{w}_fmadd_ps(_mm{w}_cvtepi32_ps(iacc_b_{mn}rows[{idx}]), {rest}")
            i += 1
            continue
        if s.startswith("// Store") and region["fmas"]:
            # the super-block loop's closing brace is the last "}" line before this comment
            k = len(out) - 1
            while out[k].strip() != "}":
                k -= 1
            ind = out[k][: len(out[k]) - len(out[k].lstrip())] + "    "
            block = ["", f"{ind}// Each row's super block scaled once: every row of a batch bit-identical to that row through the GEMV"]
            assert len(region["fmas"]) == 8 and len(region["load"]) in (2, 3), region
            if region["rows"] == 16:
                block.append(f"{ind}for (int rp = 0; rp < 4; rp++) {{")
                block += [f"{ind}    {x}" for x in region["load"] + region["fmas"]]
                block.append(f"{ind}}}")
            else:
                block += [f"{ind}{x}" for x in region["load"] + region["fmas"]]
            out[k:k] = block
            region = None
    out.append(l)
    i += 1
assert regions == 4, regions
src[start:end + 1] = out
open(path, "w").write("\n".join(src))
print("regions", regions)
