"""Training on DDLF actors (TrainerActor, sync and async schemes). Arrives with the training issue."""

__all__: list = []
