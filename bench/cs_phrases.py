"""The paraphrase bank of the customer-service benchmark (``bench.cs_stream``).

This module owns every sentence the generated support chats are made of: order states,
profile statements, agent promises and their fulfilments, one-off facts, small talk, and
the questions a bot asks about them. Each kind has at least six templates, written wide
(indirect, passive, customer-side and agent-side); ``half`` splits every list the same
way: even indices are half "A" (development, rules may be written from it), odd indices
half "B" (held out). Lists are written in pairs so that each half gets both sides.

Template syntax: ``{slot}`` is filled by the generator; ``[...]`` marks the value span,
the distinctive words a context shows when it shows that value (the brackets are dropped
from the text). Value templates are ``(role, template)`` with role ``user`` (the customer)
or ``assistant`` (the agent). Data only.
"""

from __future__ import annotations

from typing import Literal, TypeVar

Half = Literal["A", "B"]
Side = Literal["user", "assistant"]
Template = tuple[Side, str]
T = TypeVar("T")

U: Side = "user"
AG: Side = "assistant"


def half(items: tuple[T, ...], which: Half) -> tuple[T, ...]:
    """Even indices for half A, odd for half B."""
    return items[0::2] if which == "A" else items[1::2]


# --- order states ---------------------------------------------------------------------------
# {what}: "order C-73120", "the kettle", "my parcel" / "your parcel" (the side's wording).

STATES: dict[str, tuple[Template, ...]] = {
    "placed": (
        (AG, "I can see {what} [was placed on {date} and is being packed]."),
        (AG, "Our system shows {what} [confirmed on {date}, awaiting dispatch]."),
        (U, "I put in {what} [on {date} and got the confirmation email]."),
        (U, "The confirmation for {what} [came through on {date}]."),
        (AG, "{what} [went through on {date}], it's with the warehouse team now."),
        (U, "I ordered {what} [on {date} and it still says processing]."),
    ),
    "shipped": (
        (AG, "Good news, {what} [was handed over to {courier} on {weekday}]."),
        (AG, "{what} [left our warehouse on {weekday}] with {courier}."),
        (U, "The tracking says {what} [was dispatched with {courier}]."),
        (U, "I got an email that {what} [is out with {courier} now]."),
        (AG, "{what} [has been shipped under tracking {tracking}]."),
        (AG, "As of this morning {what} [is on its way via {courier}]."),
        (U, "Looks like {what} [finally shipped on {weekday}]."),
        (U, "The app says {what} [got picked up by {courier} on {weekday}]."),
    ),
    "delayed": (
        (AG, "I'm afraid {what} [is stuck at the {city} sorting hub]."),
        (AG, "{what} [is held up at the {courier} hub in {city}] because of a backlog."),
        (U, "The tracking for {what} [hasn't moved from the {city} depot in a week]."),
        (U, "It seems {what} [is sitting in a {city} warehouse] and nothing is happening."),
        (AG, "There's a delay: {what} [missed its connection in {city}]."),
        (AG, "{what} [is delayed at the {city} sorting centre], two more days they say."),
        (U, "Apparently {what} [got stuck in {city}] over the weekend."),
        (U, "For days now {what} [has shown 'in transit' at {city}]."),
    ),
    "delivered": (
        (U, "{what} [turned up at last on {weekday}]."),
        (U, "Good news, {what} [arrived on {weekday}] in one piece."),
        (AG, "{courier} confirm that {what} [was delivered on {weekday} at {hour}]."),
        (AG, "Our records show {what} [was signed for by {signer}]."),
        (U, "The driver [dropped it off on {weekday}], {what} I mean."),
        (AG, "According to the tracking {what} [reached you on {weekday}]."),
    ),
    "lost": (
        (AG, "I'm sorry, {courier} have [declared it lost in transit], {what} that is."),
        (AG, "After the trace, {what} [is confirmed lost by {courier}]."),
        (U, "{courier} told me {what} [is lost somewhere after {city}]."),
        (U, "So {what} [has vanished], the tracking just stopped in {city}."),
        (AG, "Unfortunately {what} [can't be found anywhere in the {courier} network]."),
        (U, "It looks like {what} [went missing on the way from {city}]."),
    ),
    "damaged": (
        (U, "{what} [arrived with a cracked {part}]."),
        (U, "When I opened {what} [the {part} was smashed]."),
        (AG, "Sorry to see the photos, {what} [was damaged in transit, the {part} is broken]."),
        (AG, "I've logged that {what} [came with a dented {part}]."),
        (U, "As I unpacked {what} I saw [the {part} had snapped]."),
        (AG, "The courier report says {what} [was crushed, {part} included]."),
    ),
    "replacement": (
        (AG, "I've [sent a replacement {product} out on {weekday}] for {what}."),
        (AG, "[A second {product} is on its way with {courier}] instead of {what}."),
        (U, "I got the email that [a new {product} was dispatched] to replace {what}."),
        (U, "I see [the replacement {product} shipped on {weekday}], thanks."),
        (AG, "[A replacement went out with {courier} on {weekday}] for {what}."),
        (U, "You've [sent me another {product}] in place of {what}, I noticed."),
    ),
    "refunded": (
        (AG, "I've [refunded {amount} to your card] for {what}."),
        (AG, "{what} [is fully refunded, {amount} back to the original payment]."),
        (U, "[The {amount} refund came through] for {what}."),
        (U, "I can see [{amount} credited back to me] for {what}."),
        (AG, "[A refund of {amount} was processed on {weekday}] for {what}."),
        (U, "[{amount} is back in my account] for {what}, thanks."),
    ),
}
# How an order's status moves on; a customer's story is a prefix of one of these.
PATHS: tuple[tuple[str, ...], ...] = (
    ("placed", "shipped", "delayed", "delivered"),
    ("shipped", "delayed", "lost", "replacement", "delivered"),
    ("shipped", "delivered", "damaged", "refunded"),
    ("placed", "shipped", "lost", "refunded"),
    ("shipped", "damaged", "replacement", "delivered"),
    ("placed", "shipped", "delayed", "lost", "refunded"),
)
# The customer asking before the agent states a status (content, not small talk).
ENQUIRIES: tuple[str, ...] = (
    "Any news on {what}?",
    "Can you check where {what} is?",
    "I'm chasing {what}, what's going on?",
    "Could you look up {what} for me please?",
    "What's happening with {what}?",
    "I wanted to ask about {what}.",
    "Is there an update on {what}?",
    "I'd like to know where {what} has got to.",
)

# After the agent states a status the customer may ask on (content, no value in it).
FOLLOW_UPS: tuple[str, ...] = (
    "So when will it actually get here?",
    "What do I do now then?",
    "Is there anything I need to do on my side?",
    "How long does that usually take?",
    "Will I get an email when it moves?",
    "Should I wait at home for it?",
)
FOLLOW_UP_REPLIES: tuple[str, ...] = (
    "Nothing needed from you, we'll keep an eye on it.",
    "Usually a few working days, but I'll keep watching it.",
    "You'll get a notification as soon as anything changes.",
    "No need to wait in, the driver will follow your delivery note.",
    "I'd give it until the end of the week before worrying.",
    "We'll update you by email either way.",
)

# --- profile attributes ---------------------------------------------------------------------

ATTRIBUTES: dict[str, tuple[Template, ...]] = {
    "address": (
        (U, "My address is [{value}]."),
        (U, "Please send everything to [{value}]."),
        (AG, "I have your delivery address as [{value}], is that right?"),
        (AG, "Your account lists [{value}] as the delivery address."),
        (U, "It should go to [{value}], that's home."),
        (AG, "Parcels go to [{value}] at the moment."),
    ),
    "address_change": (
        (U, "I've moved, my new address is [{value}]."),
        (U, "From now on please deliver to [{value}] instead."),
        (AG, "I've updated your delivery address to [{value}]."),
        (AG, "Done, future orders will go to [{value}]."),
        (U, "We moved house last week, it's [{value}] now."),
        (U, "Could you change my address to [{value}]? We've relocated."),
        (AG, "The address on file is now [{value}]; the old one is removed."),
        (AG, "Noted the move: [{value}] is your address going forward."),
    ),
    "phone": (
        (U, "You can reach me on [{value}]."),
        (U, "My mobile is [{value}] if you need me."),
        (AG, "The number we have for you is [{value}]."),
        (AG, "I'll note [{value}] as your contact number."),
        (U, "Best number for me is [{value}]."),
        (AG, "We'd text [{value}] with delivery updates, correct?"),
    ),
    "phone_change": (
        (U, "I've got a new phone number, it's [{value}]."),
        (U, "Please use [{value}] from now on, the old number is gone."),
        (AG, "Your phone number is updated to [{value}]."),
        (AG, "I've swapped your number for [{value}] on the account."),
        (U, "My number changed to [{value}] last month."),
        (AG, "Texts will now go to [{value}] instead."),
    ),
    "email": (
        (U, "My email is [{value}]."),
        (U, "You can email me at [{value}]."),
        (AG, "We send your receipts to [{value}]."),
        (AG, "The email on your account is [{value}]."),
        (U, "Send the invoice to [{value}] please."),
        (AG, "I've emailed the details to [{value}]."),
    ),
    "email_change": (
        (U, "I've changed my email address to [{value}]."),
        (U, "Please write to [{value}] from now on, not the old address."),
        (AG, "Your email is now [{value}], I've updated it."),
        (AG, "Future emails will go to [{value}]."),
        (U, "New email for me: [{value}]."),
        (AG, "I've replaced the old email with [{value}]."),
    ),
    "delivery": (
        (U, "For deliveries, please [{value}]."),
        (U, "If I'm out, the driver can [{value}]."),
        (AG, "I've noted that couriers should [{value}]."),
        (AG, "Your delivery instruction says: [{value}]."),
        (U, "Could you add a note so they [{value}]?"),
        (AG, "Okay, the courier will [{value}] when you're not in."),
    ),
    "delivery_change": (
        (U, "Change of plan for deliveries: please [{value}] instead."),
        (U, "Actually, don't do that any more, just [{value}]."),
        (AG, "I've replaced your old delivery note; drivers will now [{value}]."),
        (AG, "Updated: from today the courier should [{value}]."),
        (U, "New instructions for the driver: [{value}]."),
        (AG, "The delivery preference is changed, they'll [{value}] now."),
    ),
    "contact": (
        (U, "For updates, please [{value}]."),
        (U, "It's easiest if you [{value}]."),
        (AG, "I've set your contact preference: we'll [{value}]."),
        (AG, "Noted that we should [{value}]."),
        (U, "I'd rather you [{value}], if that's alright."),
        (AG, "Our notes say to [{value}] when we need you."),
    ),
    "contact_change": (
        (U, "Can you change how you contact me? Please [{value}] now."),
        (U, "Different request now: [{value}]."),
        (AG, "Contact preference updated, from now on we'll [{value}]."),
        (AG, "I've changed the note, the team will [{value}]."),
        (U, "Going forward I'd prefer you [{value}]."),
        (AG, "From today we [{value}], as you asked."),
    ),
}
# Values of the two preferences: imperative phrases that fit every template above.
DELIVERY_OPTIONS: tuple[str, ...] = (
    "leave it with the neighbour at number {n}",
    "leave it in the safe place behind the bin",
    "collect it from the parcel locker on {street}",
    "leave it in the porch behind the plant pot",
    "hand it to reception at my office",
    "leave it in the shed by the side gate",
    "bring it round to the back door",
)
CONTACT_OPTIONS: tuple[str, ...] = (
    "text me rather than call",
    "email me and never phone",
    "call me after six in the evening",
    "message me on WhatsApp",
    "only ring me on weekdays",
)

# --- promises -------------------------------------------------------------------------------
# Agent promises (the span is the promise), their fulfilments in other words (either side),
# and the topic a chase or a question names.

PROMISES: dict[str, tuple[str, ...]] = {
    "collection": (
        "I'll [arrange a collection of the {product} for {weekday}].",
        "We'll [send a courier to pick up the {product} on {weekday}].",
        "A driver [will come for the {product} on {weekday}], I've booked it.",
        "Expect [{courier} to collect the {product} on {weekday}].",
        "I'm going to [book a pickup for the {product} on {weekday}].",
        "You'll have [the {product} collected from you on {weekday}].",
    ),
    "refund": (
        "We'll [refund the {amount} within 5 days].",
        "I'll [put {amount} back on your card] by the end of the week.",
        "You'll [get the {amount} delivery charge back] in a few days.",
        "I'm going to [return the {amount} to your account] today.",
        "The [{amount} will be refunded to you] within 3 to 5 working days.",
        "Let me [reverse the {amount} charge], it will take a few days to show.",
    ),
    "callback": (
        "I'll [call you back on {weekday}].",
        "A colleague [will ring you on {weekday} afternoon].",
        "Expect [a phone call from us on {weekday}].",
        "I'm going to [phone you on {weekday} with an update].",
        "We'll [give you a ring on {weekday}] once I know more.",
        "Someone from the team [will call you on {weekday} morning].",
    ),
    "voucher": (
        "I'll [email you a {amount} voucher] for the trouble.",
        "As an apology we'll [send a {amount} gift code] today.",
        "You'll [receive {amount} store credit] by tomorrow.",
        "I'm [adding a {amount} goodwill credit] to your account, it will show shortly.",
        "We'll [post you a {amount} voucher] this week.",
        "Let me [set up a {amount} discount code] for your next order.",
    ),
}
FULFILMENTS: dict[str, tuple[Template, ...]] = {
    "collection": (
        (AG, "The courier [picked the {product} up this morning]."),
        (AG, "We've [received the returned {product} at our warehouse]."),
        (U, "The driver [came and took the {product} away] on {weekday}."),
        (U, "[{courier} collected the {product}] as planned."),
        (AG, "I can see [the {product} pickup was completed]."),
        (U, "[The {product} has gone back], someone came for it."),
    ),
    "refund": (
        (U, "[The money is back on my card], thanks."),
        (U, "I checked my statement and [the {amount} is there]."),
        (AG, "[The refund has cleared] on our side."),
        (AG, "[Your card was credited] on {weekday}."),
        (U, "[Got my {amount} back] at last."),
        (AG, "The bank confirms [the repayment reached you]."),
    ),
    "callback": (
        (U, "Your colleague [rang me on {weekday}] and explained everything."),
        (U, "[Thanks for the call] on {weekday}, it helped."),
        (AG, "I [spoke to you on the phone on {weekday}] as agreed."),
        (AG, "Our notes show [we phoned you on {weekday}]."),
        (U, "[Someone called me back] like you said."),
        (AG, "[The call-back was made on {weekday}]."),
    ),
    "voucher": (
        (U, "[The voucher code arrived] in my inbox."),
        (U, "[I got the gift code] you sent, thank you."),
        (AG, "[The {amount} credit is now on your account]."),
        (AG, "The system shows [the discount code was delivered]."),
        (U, "[I used the {amount} credit] on {weekday}."),
        (AG, "[Your goodwill code went out on {weekday}]."),
    ),
}
TOPICS: dict[str, str] = {
    "collection": "the collection of the {product}",
    "refund": "the {amount} refund",
    "callback": "the call back",
    "voucher": "the {amount} voucher",
}
# The customer asking for something before the agent promises it (content, no value).
REQUESTS: tuple[str, ...] = (
    "What can you do about it?",
    "How are you going to fix this?",
    "I'd like this sorted out properly, please.",
    "Can you make up for the hassle somehow?",
    "What are my options here?",
    "I really need someone to sort this out.",
)
CHASES: tuple[str, ...] = (
    "I'm still waiting for {topic} you promised.",
    "Nothing has happened about {topic} yet.",
    "Whatever happened to {topic}? I was told it was sorted.",
    "I was promised {topic} weeks ago and I'm still waiting.",
    "Can you look into {topic}? It never happened.",
    "Still no sign of {topic}, to be honest.",
)
CHASE_REPLIES: tuple[str, ...] = (
    "I'm sorry about that, I've flagged it to the team.",
    "Apologies, that should have happened already.",
    "I'm sorry, I can see it was missed on our side.",
    "That's not good enough, I've escalated it.",
    "My apologies, I've put an urgent note on your account.",
    "Sorry, I can see the request stalled.",
)

# --- one-off facts --------------------------------------------------------------------------

ONE_OFFS: dict[str, tuple[str, ...]] = {
    "allergy": (
        "By the way I'm allergic to [{value}], so no samples with it please.",
        "Just so you know, [{value}] gives me a nasty reaction.",
        "Please note there's a severe [{value}] allergy in our house.",
        "I can't be near [{value}], I react badly to it.",
        "Heads up: [{value}] allergy here, check the packaging.",
        "My doctor says I must avoid [{value}] completely.",
    ),
    "pet": (
        "Sorry, that's my dog [{value}] barking in the background.",
        "[{value}], my cat, just walked across the keyboard!",
        "My spaniel [{value}] chewed the box, ha.",
        "Excuse the noise, [{value}] the puppy wants a walk.",
        "Our cat is called [{value}] and she loves the cardboard.",
        "I was out walking [{value}], my terrier, when the driver came.",
    ),
    "gift": (
        "It's [{value}] so it has to arrive on time.",
        "This one is [{value}], which is why I'm worried.",
        "I bought it as [{value}].",
        "The thing is, it's [{value}] and the date is close.",
        "Please don't put a receipt in, it's [{value}].",
        "I need it soon because it's [{value}].",
    ),
    "employer": (
        "I work at [{value}] so daytime deliveries are tricky.",
        "I'm on shifts at [{value}], that's why I miss the courier.",
        "My employer is [{value}], they won't take parcels for staff.",
        "I'm usually at [{value}] during the day.",
        "Work at [{value}] keeps me out until seven.",
        "I've just started at [{value}], long hours.",
    ),
    "language": (
        "My first language is [{value}], sorry if my English is off.",
        "If anyone speaks [{value}] that would be easier for me.",
        "I'd prefer [{value}] if you have an agent for it.",
        "[{value}] is what I speak at home, English is my second language.",
        "Could you write to me in [{value}] next time?",
        "I'm more comfortable in [{value}], to be honest.",
    ),
}
ONE_OFF_VALUES: dict[str, tuple[str, ...]] = {
    "allergy": ("sesame", "peanuts", "latex", "shellfish", "nickel", "lavender oil"),
    "pet": ("Biscuit", "Pepper", "Miso", "Rolo", "Nutmeg", "Waffles", "Ziggy"),
    "gift": (
        "a birthday present for my niece",
        "an anniversary gift for my wife",
        "a retirement present for my dad",
        "a christening gift for my godson",
        "a housewarming present for my sister",
        "a graduation gift for my nephew",
    ),
    "employer": (
        "Harland Logistics",
        "St Brigid's Hospital",
        "Northgate Council",
        "Fenwick and Sons",
        "Calder Valley School",
        "Orrin Software",
    ),
    "language": ("Portuguese", "Polish", "Welsh", "Romanian", "Tagalog", "Gujarati"),
}

# --- small talk -----------------------------------------------------------------------------

SMALL_TALK: dict[str, tuple[str, ...]] = {
    "greeting": (
        "Hi there.",
        "Hello, hope you can help.",
        "Good morning!",
        "Hey, it's me again.",
        "Hi, I need a hand with something.",
        "Afternoon, got a minute?",
    ),
    "agent_greeting": (
        "Hello, thanks for contacting Brightside support. How can I help?",
        "Hi! You're through to Brightside, what can I do for you today?",
        "Good to hear from you, how can I help today?",
        "Welcome back to Brightside chat, what can I help with?",
        "Hi, this is the support team. What's up?",
        "Hello and thanks for waiting, how may I help?",
    ),
    "filler": (
        "One moment while I check that for you.",
        "Let me just pull up your account.",
        "Bear with me a second.",
        "Give me a moment to look.",
        "Just checking our system now.",
        "Hang on, loading your details.",
    ),
    "ack": (
        "Okay, great.",
        "Ah, good to know.",
        "Right, thanks.",
        "Perfect, cheers.",
        "Alright then.",
        "Lovely, thank you.",
    ),
    "agent_ack": (
        "Glad to hear it!",
        "Thanks for letting me know.",
        "Understood, thanks.",
        "Noted, thank you.",
        "That's helpful, thanks.",
        "Good, thanks for the update.",
    ),
    "chitchat": (
        "Lovely weather today, isn't it?",
        "Sorry, it's been a hectic week here.",
        "Got big plans for the weekend?",
        "It's pouring with rain here again.",
        "Hope your day is going better than mine, haha.",
        "Long day at work, I'm shattered.",
    ),
    "agent_chitchat": (
        "Ha, same here, it never stops.",
        "Oh no, hope it brightens up for you!",
        "Just a quiet one for me, thanks for asking.",
        "I hear you, it's been busy here too.",
        "Sounds like you deserve a cup of tea.",
        "Fingers crossed for a sunny weekend.",
    ),
    "anything_else": (
        "Is there anything else I can help with?",
        "Anything else today?",
        "Can I help with anything more?",
        "Was there something else you needed?",
        "Is that everything for now?",
        "Anything more I can do for you today?",
    ),
    "nothing_else": (
        "No, that's all, thanks.",
        "That's everything, thank you.",
        "Nope, all good.",
        "No thanks, that covers it.",
        "That's it for today.",
        "Nothing else, cheers.",
    ),
    "signoff": (
        "Have a lovely day!",
        "Take care, bye for now.",
        "Thanks for chatting, have a good one.",
        "Bye, and enjoy your evening.",
        "All the best, speak soon.",
        "Thanks for your patience, goodbye!",
    ),
    "customer_signoff": (
        "Bye!",
        "Thanks again, bye.",
        "Cheers, have a good day.",
        "Great, speak soon.",
        "Thank you so much, bye bye.",
        "Brilliant, thanks for your help.",
    ),
}

# --- the questions a bot asks ---------------------------------------------------------------

QUESTIONS: dict[str, tuple[str, ...]] = {
    "status_ref": (
        "what's the status of order {ref}?",
        "has order {ref} arrived yet?",
        "any update on order {ref}?",
        "where is order {ref} at the moment?",
        "what happened with order {ref}?",
        "is order {ref} sorted out now?",
    ),
    "status_product": (
        "where is the customer's {product}?",
        "what happened with the {product} order?",
        "is the {product} delivered yet?",
        "what's going on with the customer's {product}?",
        "did the {product} ever arrive?",
        "what's the latest on the {product}?",
    ),
    "address": (
        "what address should we ship to?",
        "where does the customer live now?",
        "what's the current delivery address?",
        "which address is on file for this customer?",
        "where should the parcel be sent?",
        "what is the customer's home address?",
    ),
    "phone": (
        "what's the customer's phone number?",
        "which number should we call?",
        "what's the best phone number for this customer?",
        "how do we reach the customer by phone?",
        "what mobile number do we have?",
        "what number should the courier text?",
    ),
    "email": (
        "what's the customer's email address?",
        "where should we email the invoice?",
        "which email is on the account?",
        "what email should the receipt go to?",
        "how do we reach the customer by email?",
        "what's the current contact email?",
    ),
    "delivery": (
        "where should the courier leave parcels?",
        "what are the customer's delivery instructions?",
        "how does the customer want deliveries handled?",
        "what should the driver do if nobody is home?",
        "any delivery preference for this customer?",
        "what's the delivery note for this customer?",
    ),
    "contact": (
        "how does the customer want to be contacted?",
        "what's the customer's contact preference?",
        "should we call or text this customer?",
        "how should we get in touch with the customer?",
        "what's the best way to reach this customer?",
        "how does the customer like to get updates?",
    ),
    "promise": (
        "is {topic} still outstanding?",
        "did we follow through on {topic}?",
        "is anything still owed to this customer, like {topic}?",
        "has {topic} we promised happened yet?",
        "what did we promise about {topic}?",
        "are we still waiting on {topic} for this customer?",
    ),
    "allergy": (
        "what is the customer allergic to?",
        "does the customer have any allergies?",
        "any allergy we should know about?",
        "is there something the customer must avoid for health reasons?",
        "what allergy did the customer mention?",
        "can we send samples, any allergies?",
    ),
    "pet": (
        "what's the name of the customer's pet?",
        "what is the customer's dog or cat called?",
        "does the customer have a pet, and what's its name?",
        "what did the customer say their pet is called?",
        "the customer's pet, what's its name?",
        "which pet name did the customer mention?",
    ),
    "gift": (
        "who is the customer's order a present for?",
        "is this order a gift, and for whom?",
        "who is the gift for?",
        "why does the delivery date matter to the customer?",
        "what occasion is the order for?",
        "who will receive the present?",
    ),
    "employer": (
        "where does the customer work?",
        "who is the customer's employer?",
        "what company does the customer work for?",
        "where is the customer during the day?",
        "what's the customer's workplace?",
        "which employer did the customer mention?",
    ),
    "language": (
        "which language does the customer prefer?",
        "what is the customer's first language?",
        "should we write to the customer in another language?",
        "what language does the customer speak at home?",
        "does the customer need an agent in another language?",
        "what language would suit the customer best?",
    ),
}


def all_template_lists() -> dict[str, tuple[object, ...]]:
    """Every list of the bank by a dotted name (for tests and for the halves' check)."""
    groups: dict[str, dict[str, tuple[object, ...]]] = {
        "state": dict(STATES),
        "attribute": dict(ATTRIBUTES),
        "promise": dict(PROMISES),
        "fulfilment": dict(FULFILMENTS),
        "one_off": dict(ONE_OFFS),
        "small_talk": dict(SMALL_TALK),
        "question": dict(QUESTIONS),
        "misc": {
            "enquiry": ENQUIRIES,
            "follow_up": FOLLOW_UPS,
            "follow_up_reply": FOLLOW_UP_REPLIES,
            "request": REQUESTS,
            "chase": CHASES,
            "chase_reply": CHASE_REPLIES,
        },
    }
    return {f"{g}.{k}": v for g, lists in groups.items() for k, v in lists.items()}
