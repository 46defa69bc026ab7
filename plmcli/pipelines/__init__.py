"""Orchestration of the long commands (pretrain, finetune): what plmcli.api calls to do the work. A pipeline
puts the services together (train/, eval/, the run directory in plmcli.runs) and imports nothing above it."""
