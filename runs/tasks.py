from celery import shared_task

from runs import services


@shared_task(acks_late=True)
def tokenizer_train_task(run_id: int) -> None:
    services.tokenizer_train(run_id=run_id)
