python3 -m accelerate.commands.launch \
  --config_file=/home/u/gtrain/demo/workdir/accel.yaml \
  --multi_gpu \
  --num_machines=2 \
  --machine_rank=1 \
  --main_process_ip=10.0.0.5 \
  --main_process_port=29500 \
  --num_processes=4 \
  --rdzv_backend=static \
  --rdzv_conf=timeout=300 \
  --max_restarts=0 \
  --mixed_precision no \
  --no_python \
  bash /home/u/gtrain/demo/jobs/demo-20260101-000000-abcd/rank.sh train.py --steps 50 --name 'a b;c'
