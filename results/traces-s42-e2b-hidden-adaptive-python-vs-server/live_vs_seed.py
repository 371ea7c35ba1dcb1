import sys, statistics as st, collections
for f in sys.argv[1:]:
    seeds = {}; live = collections.defaultdict(list)
    for l in open(f):
        p = l.split()
        if p[0] == "seed": seeds[int(p[1])] = float(p[2])*1000
        if p[0] == "pass": live[int(p[1])].append(float(p[2])*1000)
    out = []
    for r in sorted(seeds):
        if live[r]: out.append(f"{r}:{seeds[r]:.0f}/{st.median(live[r]):.0f}({len(live[r])})")
        else: out.append(f"{r}:{seeds[r]:.0f}/-")
    print(f.split('.')[0][6:], " ".join(out))
