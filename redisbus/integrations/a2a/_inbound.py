"""Inbound: every member of a channel answers as an A2A agent.

A message from an A2A caller becomes one bus message from the caller's member name (bound to
its bearer token, never taken from the request) to the member whose URL was called. The A2A
task is that bus message: its state is read from the message's receipt each time it is asked
for, and its result is the member's reply (the message whose ``reply_to`` is the task's id).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler, validate_request_params
from a2a.server.tasks import InMemoryTaskStore
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.input_mode_validator import validate_input_modes
from a2a.utils.task import apply_history_length, validate_history_length, validate_page_size

from ... import AsyncAgent, AsyncChannel, RedisbusError
from ... import Message as BusMessage
from ... import _otel as otel
from ._convert import (
    INPUT_MODES,
    TERMINAL,
    agent_message,
    refusal,
    state_of,
    task_of,
    text_of,
)

__all__ = ["BusRequestHandler", "Named"]

log = logging.getLogger("redisbus.a2a")

TASKS_CAP = 10_000  # tasks remembered per bridge process, oldest forgotten first
# what a member takes in: text, and structured data (bridged as JSON text)
_INPUTS = AgentCard(default_input_modes=INPUT_MODES)


class Named(User):
    """An authenticated caller: the member name its bearer token stands for."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self._name


def _owner(context: ServerCallContext) -> str:
    """Whose tasks these are: one caller's, on one member (the store keeps them apart)."""
    return f"{context.user.user_name}\n{context.state.get('member', '')}"


@dataclass
class _Task:
    id: str  # the bus message id
    context_id: str
    caller: str
    member: str
    request: Message
    cancelled: bool = False
    reply: BusMessage | None = None
    shown: Task | None = None  # the task as last shown: a new state restamps it, nothing else
    created: float = field(default_factory=time.monotonic)

    @property
    def owner(self) -> ServerCallContext:
        return ServerCallContext(user=Named(self.caller), state={"member": self.member})

    @property
    def settled(self) -> bool:
        return self.shown is not None and self.shown.status.state in TERMINAL


class _Caller:
    """One authenticated caller's member handle; a lock serialises the calls on it."""

    def __init__(self, agent: AsyncAgent) -> None:
        self.agent = agent
        self.lock = asyncio.Lock()


class BusRequestHandler(RequestHandler):
    """The A2A request handler of one channel; the member is the one the URL names
    (``context.state["member"]``), the caller the one its token names (``context.user``)."""

    def __init__(
        self,
        channel: AsyncChannel,
        *,
        replica: str,
        send_wait_s: float = 30.0,
        stream_wait_s: float = 600.0,
    ) -> None:
        self.channel = channel
        self.replica = replica
        self.send_wait_s = send_wait_s
        self.stream_wait_s = stream_wait_s
        self._callers: dict[str, _Caller] = {}
        self._tasks: OrderedDict[str, _Task] = OrderedDict()
        # the tasks as last shown, for ListTasks' filters, order and page tokens
        self.store = InMemoryTaskStore(owner_resolver=_owner)
        self._join_lock = asyncio.Lock()

    # -- who and what -------------------------------------------------------------------
    async def caller(self, context: ServerCallContext) -> _Caller:
        if not context.user.is_authenticated:  # the app answers 401 before; never guess a name
            raise InvalidRequestError("unauthenticated: a bearer token is required")
        name = context.user.user_name
        got = self._callers.get(name)
        if got is None:
            async with self._join_lock:
                got = self._callers.get(name)
                if got is None:
                    try:
                        agent = await self.channel.join(name, replica=self.replica)
                    except RedisbusError as e:
                        raise refusal(e) from e
                    got = self._callers[name] = _Caller(agent)
        return got

    async def member(self, context: ServerCallContext) -> str:
        name = str(context.state.get("member", ""))
        if name not in await self.channel.members():
            raise InvalidParamsError(
                f"unknown_agent: no member {name!r} on channel {self.channel.name!r}",
                data={"reason": "unknown_agent"},
            )
        return name

    def _task(self, task_id: str, context: ServerCallContext) -> _Task:
        t = self._tasks.get(task_id)
        # another caller's task, or one of another member, does not exist for this caller
        if (
            t is None
            or t.caller != context.user.user_name
            or t.member != context.state.get("member")
        ):
            raise TaskNotFoundError(f"no task {task_id!r}")
        return t

    # -- sending ------------------------------------------------------------------------
    async def _send(self, params: SendMessageRequest, context: ServerCallContext) -> _Task:
        validate_history_length(params.configuration)
        member = await self.member(context)
        msg = params.message
        validate_input_modes(msg, _INPUTS)
        body = text_of(msg.parts)
        reply_to = None
        context_id = msg.context_id or str(uuid.uuid4())
        if msg.task_id:  # a follow-up in a task: a reply to that task's message, on the bus
            before = self._task(msg.task_id, context)
            if msg.context_id and msg.context_id != before.context_id:
                raise InvalidParamsError(
                    f"context {msg.context_id!r} is not the context of task {before.id!r}"
                )
            state = (await self.snapshot(before)).status.state
            if state in TERMINAL:
                raise UnsupportedOperationError(
                    f"task {before.id} is {TaskState.Name(state)}: it takes no more messages"
                )
            reply_to, context_id = before.id, before.context_id
        who = await self.caller(context)
        # optional bus fields a caller may set in the message's metadata
        subject = str(msg.metadata["subject"]) if "subject" in msg.metadata else ""
        ttl_s = msg.metadata["ttl_s"] if "ttl_s" in msg.metadata else None  # noqa: SIM401 - a protobuf Struct has no .get()
        headers = context.state.get("headers")
        try:
            # a caller's traceparent header continues into the member's processing span
            with otel.continued(headers if isinstance(headers, dict) else {}):
                async with who.lock:
                    r = await who.agent.send(
                        member,
                        body,
                        subject=subject,
                        type="request",
                        reply_to=reply_to,
                        ttl_s=ttl_s,  # type: ignore[arg-type]  # any JSON value: send() refuses a non-number (InvalidInput)
                    )
        except RedisbusError as e:
            raise refusal(e) from e
        request = Message()
        request.CopyFrom(msg)
        t = _Task(
            id=str(r.id),
            context_id=context_id,
            caller=who.agent.name,
            member=member,
            request=request,
        )
        t.request.task_id, t.request.context_id = t.id, t.context_id
        self._tasks[t.id] = t
        while len(self._tasks) > TASKS_CAP:
            _, old = self._tasks.popitem(last=False)
            await self.store.delete(old.id, old.owner)
        return t

    async def snapshot(self, t: _Task) -> Task:
        """The task as its receipt (and the member's reply) show it now. A terminal task is
        final, and an unchanged state shows the same task (timestamp, status message)."""
        if t.shown is not None and t.settled:
            return _copy(t.shown)
        r = None
        if not t.cancelled:
            who = self._callers[t.caller]
            async with who.lock:
                receipts = await who.agent.receipt(t.id)
            r = next((x for x in receipts if x.to == t.member), None)
        state = state_of(r, t.cancelled)
        if t.shown is not None and t.shown.status.state == state:
            return _copy(t.shown)
        status_msg: Message | None = None
        reply_text: str | None = None
        if state == TaskState.TASK_STATE_COMPLETED:
            reply = t.reply or await self._find_reply(t)
            reply_text = reply.body if reply else (r.result if r and r.result else "")
            status_msg = agent_message(
                reply_text,
                task_id=t.id,
                context_id=t.context_id,
                redisbusId=reply.id if reply else None,  # A2A's JSON names are camelCase
                redisbusFrom=t.member,
            )
        elif state == TaskState.TASK_STATE_FAILED and r is not None:
            reason = f"{r.error.code}: {r.error}" if r.error else f"{r.status}: {r.result or ''}"
            status_msg = agent_message(
                reason.strip(), task_id=t.id, context_id=t.context_id, reason=r.status
            )
        history = [t.request] + ([status_msg] if status_msg is not None else [])
        t.shown = task_of(t.id, t.context_id, state, status_msg, history, reply_text)
        await self.store.save(t.shown, t.owner)
        return _copy(t.shown)

    async def _find_reply(self, t: _Task) -> BusMessage | None:
        who = self._callers[t.caller]
        async with who.lock:
            got = await who.agent.list(
                filter_by=f"from:{t.member} to:me", since=t.id, limit=1000, preview_chars=None
            )
            reply = next((m for m in got if m.reply_to == t.id), None)
            if reply is not None:
                # handed to the A2A caller through the task: done on the bus, so the
                # caller's inbox does not fill up with replies nobody else reads
                await who.agent.mark_done(reply.id, result="a2a task completed")
                t.reply = reply
        return reply

    async def _settled(self, t: _Task, wait_s: float) -> Task:
        deadline = time.monotonic() + wait_s
        pause = 0.02
        while True:
            task = await self.snapshot(t)
            if task.status.state in TERMINAL or time.monotonic() >= deadline:
                return task
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 0.5)

    async def _follow(self, t: _Task) -> AsyncGenerator[Task | TaskStatusUpdateEvent]:
        task = await self.snapshot(t)
        yield task
        state = task.status.state
        deadline = time.monotonic() + self.stream_wait_s
        pause = 0.02
        while state not in TERMINAL and time.monotonic() < deadline:
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, 0.5)
            task = await self.snapshot(t)
            if task.status.state != state:
                state = task.status.state
                pause = 0.02
                yield TaskStatusUpdateEvent(
                    task_id=t.id, context_id=t.context_id, status=task.status
                )

    # -- the A2A methods ----------------------------------------------------------------
    @validate_request_params
    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        t = await self._send(params, context)
        wait_s = 0.0 if params.configuration.return_immediately else self.send_wait_s
        return apply_history_length(await self._settled(t, wait_s), params.configuration)

    @validate_request_params
    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        t = await self._send(params, context)
        async for event in self._follow(t):
            if isinstance(event, Task):
                event = apply_history_length(event, params.configuration)
            yield event

    @validate_request_params
    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any]:
        t = self._task(params.id, context)
        state = (await self.snapshot(t)).status.state
        if state in TERMINAL:  # nothing more will happen to it: GetTask shows it
            raise UnsupportedOperationError(f"task {t.id} is {TaskState.Name(state)}")
        async for event in self._follow(t):
            yield event

    @validate_request_params
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        validate_history_length(params)
        return apply_history_length(await self.snapshot(self._task(params.id, context)), params)

    @validate_request_params
    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        validate_history_length(params)
        if params.HasField("page_size"):
            validate_page_size(params.page_size)
        owner = (context.user.user_name, context.state.get("member"))
        # the live tasks first, so the status filter and the order see their states now
        for t in list(self._tasks.values()):
            if (t.caller, t.member) == owner and not t.settled:
                await self.snapshot(t)
        page = await self.store.list(params, context)
        for task in page.tasks:
            if not params.include_artifacts:
                task.ClearField("artifacts")
            task.CopyFrom(apply_history_length(task, params))
        return page

    @validate_request_params
    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        """A bus message cannot be unsent: the member is told with a follow-up (``reply_to``
        the task, subject ``cancel``) and the task is canceled, a terminal state: whatever
        the member does with the request afterwards, the task stays canceled."""
        t = self._task(params.id, context)
        task = await self.snapshot(t)
        if task.status.state in TERMINAL:
            raise TaskNotCancelableError(
                f"task {t.id} is already {TaskState.Name(task.status.state)}"
            )
        who = self._callers[t.caller]
        try:
            async with who.lock:
                await who.agent.send(
                    t.member,
                    "The caller cancelled this request; stop working on it.",
                    subject="cancel",
                    reply_to=t.id,
                )
        except RedisbusError as e:
            raise refusal(e) from e
        t.cancelled = True
        return await self.snapshot(t)

    # -- not offered --------------------------------------------------------------------
    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError


def _copy(task: Task) -> Task:
    out = Task()
    out.CopyFrom(task)
    return out
