#!/bin/bash
# s37h: the empty_cache script and the graph scenario with context="alloc" (frames on
# allocations only), to see what a segment release carries there.
set -u
R=.device-carry/rel
O=/tmp/s37h; rm -rf $O; mkdir -p $O
date -u > $O/date.txt
sed 's/torch.cuda.memory._record_memory_history(\*\*kw)/torch.cuda.memory._record_memory_history(context="alloc")/' $R/user_empty_cache.py > $O/user_empty_cache_alloc.py
python3 $O/user_empty_cache_alloc.py $O/empty_cache__context_alloc.pickle >> $O/run.log 2>&1; echo "rc=$? empty_cache alloc" >> $O/run.log
sed 's/^    torch.cuda.memory._record_memory_history()$/    torch.cuda.memory._record_memory_history(context="alloc")/' $R/user_scenarios.py > $O/user_scenarios_alloc.py
python3 $O/user_scenarios_alloc.py $O/scenario_train_empty_cache__context_alloc.pickle train_empty_cache >> $O/run.log 2>&1; echo "rc=$? train alloc" >> $O/run.log
grep -c context=.alloc $O/*.py >> $O/run.log
cd $O && tar cJf $OUT/s37h.tar.xz .
cat $O/run.log
