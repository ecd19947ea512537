python3 -m torch.distributed.run \
  --nnodes=2 \
  --nproc_per_node=2 \
  --rdzv_backend=static \
  --node_rank=1 \
  --rdzv_endpoint=10.0.0.5:29500 \
  --rdzv_id=demo-20260101-000000-abcd \
  --rdzv_conf=timeout=300 \
  --local_addr=10.0.0.6 \
  --max_restarts=0 \
  --no-python \
  bash /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/rank.sh train.py --steps 50 --name 'a b;c'
