error: /work/main/shardctl.yaml: 1 problem in the config
  - config file /work/main/shardctl.yaml does not exist (pass the path, or set SHARDCTL_CONFIG)
