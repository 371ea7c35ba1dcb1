import json, sys, statistics as st, collections
rows=[json.loads(l) for l in open(sys.argv[1])]
by=collections.defaultdict(dict)
for r in rows: by[(r['rep'], r['bin'])][r['arm']]=r
arms=[a for a in dict.fromkeys(r['arm'] for r in rows)]
print('rep bin', *[f'{a}(tps/tpp)' for a in arms])
for k in sorted(by):
    print(*k, *[f"{by[k][a]['tps']:.2f}/{by[k][a]['tpp']:.2f}" for a in arms if a in by[k]])
for b in ('old','new'):
    for a in arms[1:]:
        ratios=[by[k][a]['tps']/by[k]['alone']['tps'] for k in by if k[1]==b and a in by[k]]
        print(b, a, 'vs alone: per call', [round(x,3) for x in ratios], 'median', round(st.median(ratios),3))
    if 'adaptive-rejection' in arms and 'adaptive-exact' in arms:
        ratios=[by[k]['adaptive-rejection']['tps']/by[k]['adaptive-exact']['tps'] for k in by if k[1]==b]
        print(b, 'rejection/exact', [round(x,3) for x in ratios], 'median', round(st.median(ratios),3))
for a in arms:
    ratios=[by[(r,'new')][a]['tps']/by[(r,'old')][a]['tps'] for r in sorted({k[0] for k in by}) if (r,'new') in by and (r,'old') in by]
    print('new/old', a, [round(x,3) for x in ratios], 'median', round(st.median(ratios),3))
# acceptance per depth, summed
for b in ('old','new'):
    for a in arms[1:]:
        acc=[0]*4; rd=0
        for k in by:
            if k[1]==b and a in by[k]:
                rd+=by[k][a]['rounds']; acc=[x+y for x,y in zip(acc, by[k][a]['acc']+[0]*4)]
        print(b,a,'drafting passes',rd,'accepted per position',acc)
