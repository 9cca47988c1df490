#!/bin/bash
# interleaved before/after: checkpoint CPU of a 20 s --off-cpu run, checkpoint every 2 s, BlockedSplit JVM

W=/work/wt/off41; PY=$W/.venv/bin/python
javac -d /tmp/off41-bench/classes $W/tests/workloads/BlockedSplit.java
printf 'Sleeper: offcpu-sleeper\nLocker: offcpu-locker\n' > profile.txt
java -XX:+PreserveFramePointer -Xmx64m -XX:+UseSerialGC -cp /tmp/off41-bench/classes com.example.BlockedSplit < <(sleep 400) > jvm.out &
JPID=$!; sleep 3; echo "jvm $JPID"; uptime
for round in 1 2; do
 for which in before after; do
  if [ $which = before ]; then cd /tmp/off41-main; else cd $W; fi
  rm -rf /tmp/off41-bench/cap-$which-$round
  uptime
  $PY -m profiler run --duration 20 --out /tmp/off41-bench/cap-$which-$round --pid $JPID --profile /tmp/off41-bench/profile.txt --off-cpu --checkpoint 2 >run-$which-$round.log 2>&1 || echo "run failed"
  python3 -c "import json;o=json.load(open('/tmp/off41-bench/cap-$which-$round/overhead.json'));print('$which', $round, o.get('checkpoints'), o.get('checkpoint_cpu_seconds'), o.get('checkpoint_seconds'), o.get('checkpoint_bytes'))"
 done
done
kill $JPID
