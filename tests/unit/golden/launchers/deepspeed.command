if python3 -m deepspeed.launcher.runner --help 2>/dev/null | grep -q -- --no_ssh; then
  GTRAIN_DEEPSPEED_CONFIG=/home/u/gtrain/demo/workdir/ds_config.json exec python3 -m deepspeed.launcher.runner \
    --hostfile=/home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/hostfile \
    --no_ssh \
    --node_rank=1 \
    --master_addr=10.0.0.5 \
    --master_port=29500 \
    --num_nodes=2 \
    --num_gpus=2 \
    --no_python --no_local_rank \
    bash /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/rank.sh train.py --steps 50 --name 'a b;c' --deepspeed_config /home/u/gtrain/demo/workdir/ds_config.json
else
  echo "[gtrain] this DeepSpeed has no --no_ssh: starting the ranks with torchrun instead"
  GTRAIN_DEEPSPEED_CONFIG=/home/u/gtrain/demo/workdir/ds_config.json exec python3 -m torch.distributed.run \
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
    bash /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/rank.sh train.py --steps 50 --name 'a b;c' --deepspeed_config /home/u/gtrain/demo/workdir/ds_config.json
fi
