python3 /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/spawn.py \
  --flavor=tensorflow \
  --node-rank=1 \
  --num-nodes=2 \
  --nproc=2 \
  --master=10.0.0.5:29500 \
  --node-ips=10.0.0.5,10.0.0.6 \
  -- bash /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/rank.sh train.py --steps 50 --name 'a b;c'
