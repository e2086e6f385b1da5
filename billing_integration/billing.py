"""What a host project uses, from one place: ``from billing_integration import billing``, then
``billing.subscribed(request.user, "pro")``. Everything else in the package is private."""

from .access import (
    SubscriptionRequiredMixin,
    active_subscriptions,
    get_subscriber,
    in_grace_period,
    on_grace_period,
    on_trial,
    subscribed,
    subscription_required,
)
from .access.features import (
    FeatureRequiredMixin,
    feature_limit,
    feature_required,
    features_for,
    has_feature,
    products_with_feature,
    refused_feature,
)
from .access.permissions import HasActiveSubscription, HasFeature
from .checkout.changes import (
    NoPlanToChange,
    RenewalUnchanged,
    SamePlan,
    TooManyChanges,
    cancel_at_period_end,
    change_plan,
    resume,
)
from .checkout.services import (
    AlreadyBought,
    AlreadySubscribed,
    CheckoutError,
    CheckoutInProgress,
    CheckoutRefused,
    InvalidChoice,
    NoSubscriber,
    PaymentBeingConfirmed,
    PlanAlreadyHeld,
    ProductUnavailable,
    ServiceUnavailable,
    StillRenewing,
    checkout_redirect,
    checkout_url,
    start_checkout,
)
from .checkout.trials import TooManyTrials, TrialAlreadyUsed, TrialNotOffered, start_trial
from .client import get_client
from .exceptions import (
    BillingAnswerLostError,
    BillingAPIError,
    BillingAuthenticationError,
    BillingConfigurationError,
    BillingConflictError,
    BillingError,
    BillingIdempotencyConflict,
    BillingNotFoundError,
    BillingRateLimitError,
    BillingServerError,
    BillingServiceMismatchError,
    BillingTransportError,
    BillingValidationError,
    RemoteDataError,
    WebhookError,
    WebhookVerificationError,
)
from .models import (
    BillingCycle,
    CheckoutSession,
    Customer,
    Invoice,
    Payment,
    Price,
    Product,
    Refund,
    Subscription,
    WebhookEvent,
)
from .sync.signals import subscription_status_pulled
from .testing.helpers import SandboxHandle, deliver_event, sign_webhook, start_sandbox
from .testing.inline import after_commit_inline
from .webhooks.handlers import (
    EventContext,
    EventHandler,
    HandlerResult,
    InvoiceHandler,
    PaymentHandler,
    RefundHandler,
    SubscriptionHandler,
    handler,
)
from .webhooks.signals import (
    SIGNALS,
    billing_event_received,
    invoice_deleted,
    invoice_marked_uncollectable,
    invoice_paid,
    invoice_voided,
    payment_canceled,
    payment_completed,
    payment_failed,
    refund_approved,
    refund_initiated,
    refund_rejected,
    subscription_canceled,
    subscription_paused,
    subscription_renewal,
)

__all__ = [
    "SIGNALS", "AlreadyBought", "AlreadySubscribed", "BillingAPIError", "BillingAnswerLostError",
    "BillingAuthenticationError", "BillingConfigurationError", "BillingConflictError",
    "BillingCycle", "BillingError", "BillingIdempotencyConflict", "BillingNotFoundError",
    "BillingRateLimitError", "BillingServerError", "BillingServiceMismatchError",
    "BillingTransportError", "BillingValidationError", "CheckoutError", "CheckoutInProgress",
    "CheckoutRefused", "CheckoutSession", "Customer", "EventContext", "EventHandler",
    "FeatureRequiredMixin", "HandlerResult", "HasActiveSubscription", "HasFeature",
    "InvalidChoice", "Invoice", "InvoiceHandler", "NoPlanToChange", "NoSubscriber", "Payment",
    "PaymentBeingConfirmed", "PaymentHandler", "PlanAlreadyHeld", "Price", "Product",
    "ProductUnavailable", "Refund", "RefundHandler", "RemoteDataError", "RenewalUnchanged",
    "SamePlan", "SandboxHandle", "ServiceUnavailable", "StillRenewing", "Subscription",
    "SubscriptionHandler", "SubscriptionRequiredMixin", "TooManyChanges", "TooManyTrials",
    "TrialAlreadyUsed",
    "TrialNotOffered", "WebhookError", "WebhookEvent", "WebhookVerificationError",
    "active_subscriptions", "after_commit_inline", "billing_event_received",
    "cancel_at_period_end", "change_plan", "checkout_redirect", "checkout_url", "deliver_event",
    "feature_limit", "feature_required", "features_for", "get_client", "get_subscriber", "handler",
    "has_feature", "in_grace_period", "invoice_deleted", "invoice_marked_uncollectable",
    "invoice_paid", "invoice_voided", "on_grace_period", "on_trial", "payment_canceled",
    "payment_completed", "payment_failed", "products_with_feature", "refund_approved",
    "refund_initiated", "refund_rejected", "refused_feature", "resume", "sign_webhook",
    "start_checkout", "start_sandbox", "start_trial", "subscribed", "subscription_canceled",
    "subscription_paused", "subscription_renewal", "subscription_required",
    "subscription_status_pulled",
]  # fmt: skip
