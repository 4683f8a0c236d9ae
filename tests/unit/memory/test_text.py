"""Salience, "remember this", entities and tokens, in English and Chinese."""

from __future__ import annotations

import threading
import time

import pytest

from memstream.memory.text import (
    extract_entities,
    is_remember_request,
    is_salient,
    lookup_keys,
    phrase_keys,
    read_once,
    text_memo,
    tokenize,
)

# --- salience ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "hi",
        "Hello!",
        "hey there",
        "thanks",
        "Thank you so much for your help!",
        "ok",
        "OK.",
        "okay thanks",
        "bye",
        "Goodbye, see you later",
        "👍👍",
        "???",
        "...",
        "",
        "   ",
        "yes please",
        "Sounds good",
        "你好",
        "您好！",
        "谢谢",
        "谢谢你的帮助",
        "好的",
        "好的，谢谢！",
        "再见",
        "拜拜",
        "嗯嗯",
        "收到",
        "你好，我想问一下",
    ],
)
def test_low_information_turns_are_not_salient(text: str) -> None:
    assert not is_salient(text)


@pytest.mark.parametrize(
    "text",
    [
        "My order hasn't arrived yet",
        "I need to change my delivery address",
        "The blender I bought makes a grinding noise",
        "我的订单还没到",
        "请问我的订单到哪了",
        "我想修改收货地址",
        "Hi! I want to return the blue jacket",
    ],
)
def test_informative_turns_are_salient(text: str) -> None:
    assert is_salient(text)


@pytest.mark.parametrize("text", ["order 55123", "ORD-2291?", "订单号 778899", "a@b.io"])
def test_a_short_turn_naming_an_entity_is_salient(text: str) -> None:
    assert is_salient(text)


@pytest.mark.parametrize(
    "text",
    [
        "Hi, welcome to Brightside Home support! My name is Maria. How can I help you today?",
        "Hello, this is Tom from Brightside Home support. What can I do for you?",
        "Hi Ana, Maria here. How can I help?",
        "Anything else I can help you with?",
        "You're welcome. Have a nice day!",
        "Thanks for your patience. Anything else?",
        "Great to hear, thanks for letting us know!",
        "你好！请问有什么可以帮您？",
        "还有其他问题吗？",
        "Thanks maria",
        "Stay safe and chat soon!",
        "Is there anything else I can help with?",
        "Sorry again for the wait, and have a good evening!",
        "no, that's all for today",
        "Happy to help, talk soon!",
    ],
)
def test_an_agents_conversational_frame_is_not_salient(text: str) -> None:
    assert not is_salient(text)


@pytest.mark.parametrize(
    "text",
    [
        "Hi, this is Maria. I've refunded the second charge for your kettle today.",
        "Thanks for your patience: the replacement ships on Friday by express courier.",
        "Anything else? I've also updated your delivery address to Lindenstrasse.",
    ],
)
def test_content_inside_an_agents_frame_stays_salient(text: str) -> None:
    assert is_salient(text)


# --- remember requests ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "remember this",
        "Remember this: I am allergic to nuts",
        "Please remember that I'm vegetarian",
        "please remember my size is M",
        "Don't forget my birthday is in May",
        "don’t forget to call me back",  # typographic apostrophe
        "Note that my address changed",
        "Ok, note that I prefer email",
        "Could you remember that I live in Lyon?",
        "Keep this in mind for next time",
        "I want you to remember my account name",
        "记住我的地址是北京市朝阳区",
        "请记得我对花生过敏",
        "别忘了给我回电话",
        "不要忘记我的会员号",
        "帮我记一下这个订单",
    ],
)
def test_remember_requests(text: str) -> None:
    assert is_remember_request(text)


@pytest.mark.parametrize(
    "text",
    [
        "I remember buying it last year",
        "Do you remember when I called?",
        "Remember when we talked about it?",
        "Can you remember what I ordered?",
        "I don't forget things easily",
        "My notebook is broken",
        "hello",
        "我记得上次买过",
        "你好",
    ],
)
def test_not_remember_requests(text: str) -> None:
    assert not is_remember_request(text)


# --- entities ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("My order #A-10293 hasn't arrived", ["order:A-10293"]),
        ("order number 55123 was late", ["order:55123"]),
        ("Order no. 512 is wrong", ["order:512"]),
        ("my order is 88812", ["order:88812"]),
        ("order # a-10293", ["order:A-10293"]),
        ("Where is ORD-2291?", ["order:ORD-2291"]),
        ("订单号 778899 还没发货", ["order:778899"]),
        ("订单号：７７８８９９", ["order:778899"]),  # full-width digits and colon
        ("我的订单A10293怎么还没到", ["order:A10293"]),
        ("email me at John.Doe@Example.COM please", ["email:john.doe@example.com"]),
        ("call +86 138 1234 5678", ["phone:+8613812345678"]),
        ("my number is (555) 123-4567", ["phone:5551234567"]),
        ("电话13812345678", ["phone:13812345678"]),
        ("delivered on 2026-03-03", ["date:2026-03-03"]),
        ("on March 3, 2026", ["date:2026-03-03"]),
        ("on 3 March 2026", ["date:2026-03-03"]),
        ("the 3rd of March, 2026", ["date:2026-03-03"]),
        ("Sept. 12th 2025", ["date:2025-09-12"]),
        ("2026年3月3日送到", ["date:2026-03-03"]),
        ("The XR-200 broke", ["product:XR-200"]),
        ("SKU 8841-B is out of stock", ["product:8841-B"]),
        ("model 7731 please", ["product:7731"]),
        ("tracking number 1Z999AA10123456784", ["tracking:1Z999AA10123456784"]),
        ("Tracking #: JD0001234567", ["tracking:JD0001234567"]),
        ("运单号 SF1234567890", ["tracking:SF1234567890"]),
        (
            "order #A-10293, XR-200, on 2026-03-03, mail a@b.io",
            ["date:2026-03-03", "email:a@b.io", "order:A-10293", "product:XR-200"],
        ),
    ],
)
def test_entities(text: str, expected: list[str]) -> None:
    assert extract_entities(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "I want to order 3 shirts for 5 kids",
        "see you at 10:30",
        "it costs $25, or $1250 with shipping",
        "back in 2026",
        "my order is late",
        "Order 2026 was a good year",
        "24-hour delivery, 5kg, 10am, 3rd floor, covid-19",
        "pi is 3.14159265",
        "server 192.168.1.1",
        "see https://example.com/a1b2c3/x9",
        "Feb 30, 2026",  # not a real date
        "March 3",  # no year
        "谢谢，3点见",
        "sizes 8 9 10 11 12 13 14",  # digits enough for a phone, but no phone-like groups
        "",
    ],
)
def test_no_false_positive_entities(text: str) -> None:
    assert extract_entities(text) == []


def test_entities_are_sorted_and_unique() -> None:
    keys = extract_entities("order #A-10293 ... again order #a-10293, XR-200 and xr-200")
    assert keys == ["order:A-10293", "product:XR-200"]


def test_an_order_number_is_not_also_a_phone_number() -> None:
    assert extract_entities("order number 12345678") == ["order:12345678"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("#4926978 has shipped", ["order:4926978"]),  # was phone:4926978
        ("Any news on #4926978?", ["order:4926978"]),
        ("ticket #4926978 is closed", []),  # a reference, but not an order (and no phone)
        ("your parcel 4926978 has shipped", []),  # a bare 7-digit run with no phone cue
        ("call me on 4926978", ["phone:4926978"]),
        ("my number is 4926978", ["phone:4926978"]),
        ("13812345678", ["phone:13812345678"]),  # long enough to be a phone on its own
        ("+44 7700 900123", ["phone:+447700900123"]),
    ],
)
def test_a_number_is_a_phone_only_when_it_reads_as_one(text: str, expected: list[str]) -> None:
    assert extract_entities(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "order" + " " * 7990 + "!",  # was cubic with repeated optional separator runs
        "tracking" + " # " * 2600,
        "1 " * 3990 + "a",
        "a-" * 3990 + "!",
        "a." * 3990 + "@",
        "订单号 " * 1990,
    ],
    ids=["order-spaces", "tracking-marks", "digit-runs", "hyphen-runs", "email-ish", "zh-orders"],
)
def test_adversarial_max_length_text_stays_fast(text: str) -> None:
    started = time.perf_counter()
    extract_entities(text)
    is_salient(text)
    is_remember_request(text)
    tokenize(text)
    # ~30 ms on an idle box; a regex blow-up takes minutes. The bound is loose on purpose:
    # it separates the two on a machine shared with other jobs, it does not measure speed.
    assert time.perf_counter() - started < 10.0


# --- tokens --------------------------------------------------------------------------------


def test_tokenize_english_keeps_inner_hyphens_and_drops_stopwords() -> None:
    tokens = tokenize("My order #A-10293 hasn't arrived, the customer's package!")
    assert tokens == ["order", "a-10293", "arrived", "customer", "package"]


def test_tokenize_chinese_uses_character_bigrams() -> None:
    assert tokenize("订单没到") == ["订单", "单没", "没到"]
    assert tokenize("好") == ["好"]


def test_tokenize_mixed_text_keeps_order() -> None:
    assert tokenize("XR-200 坏了") == ["xr-200", "坏了"]


# --- phrases common to many users ----------------------------------------------------------


def test_phrase_keys_ignore_numbers_case_and_stopwords() -> None:
    same = phrase_keys("your PARCEL 9 is on its way")
    assert phrase_keys("Your parcel 123 is on the way.") == same
    assert phrase_keys("ok") == []  # too short to be a phrase
    assert len(phrase_keys("Refund issued. Label emailed! 退款已经处理好了。")) == 3


def test_a_phrase_common_to_many_users_counts_for_nothing() -> None:
    canned = "Thank you for shopping with Brightside, your satisfaction matters to us."
    assert is_salient(canned)
    assert not is_salient(canned, frozenset(phrase_keys(canned)))
    # The turn's own content still counts when only its canned sentence is common.
    mixed = f"{canned} The blender lid cracked after one week of use."
    assert is_salient(mixed, frozenset(phrase_keys(canned)))
    # A common sentence naming an entity stays salient: the order is the point.
    order = "Your order A-10293 has been received and is being processed."
    assert is_salient(order, frozenset(phrase_keys(order)))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("商品编号 7781 已缺货", ["product:7781"]),
        ("货号：AB1234，请帮我查一下", ["product:AB1234"]),
        ("我的手机号是 13812345678", ["phone:13812345678"]),
        ("订单号 778899 在 2026年3月3日 下单", ["date:2026-03-03", "order:778899"]),
    ],
)
def test_chinese_product_phone_order_and_date_keys(text: str, expected: list[str]) -> None:
    assert extract_entities(text) == expected


def test_a_reference_code_is_looked_up_under_every_kind_a_turn_may_file_it_as() -> None:
    asked = extract_entities("What is the status of order A-99812?")
    filed = extract_entities("the courier left them with a neighbour, ref A-99812")
    assert asked != filed  # "order" and "ref" give the same code different kinds...
    assert set(filed) <= set(lookup_keys(asked))  # ...and the lookup still meets it
    assert lookup_keys(["email:a@b.co", "order:X-1"]) == [
        "email:a@b.co",
        "order:X-1",
        "product:X-1",
        "tracking:X-1",
    ]


# --- memoised per text ----------------------------------------------------------------------


def test_memoised_answers_are_fresh_lists_a_caller_may_change() -> None:
    text = "Order A-10293 arrived. Thanks, that's all for today!"
    first = extract_entities(text)
    first.append("order:HIJACKED")
    tokens = tokenize(text)
    tokens.clear()
    keys = phrase_keys(text)
    keys.append("x")
    assert extract_entities(text) == ["order:A-10293"]
    assert tokenize(text) == ["order", "a-10293", "arrived", "thanks", "today"]
    assert len(phrase_keys(text)) == len(keys) - 1


def test_memoised_and_long_texts_answer_as_computed() -> None:
    # A text over the memo's size is computed each time; both paths give the same answer.
    short = "Please remember my email is ana@example.com"
    long = short + " " + "and more words here" * 40
    assert len(long) > 500
    for text in (short, long):
        assert extract_entities(text) == extract_entities(text) == ["email:ana@example.com"]
        assert is_remember_request(text) is True
        assert is_salient(text, frozenset()) is is_salient(text, set()) is True
    canned = "Your replacement kettle ships from Berlin tomorrow."
    assert is_salient(canned) is True
    # The memo keys on the common phrases too: heard before, the same line says nothing.
    assert is_salient(canned, frozenset(phrase_keys(canned))) is False
    assert is_salient(canned, set(phrase_keys(canned))) is False


def test_texts_read_once_are_computed_and_not_kept_on_that_thread_only() -> None:
    computed: list[str] = []

    @text_memo
    def length(text: str) -> int:
        computed.append(text)
        return len(text)

    with read_once():
        assert length("bulk") == length("bulk") == 4
        seen_elsewhere: list[int] = []
        other = threading.Thread(target=lambda: seen_elsewhere.append(length("other")))
        other.start()
        other.join()
    assert computed == ["bulk", "bulk", "other"]  # the other thread's read was kept
    assert seen_elsewhere == [5]
    assert length("bulk") == length("bulk") == 4
    assert length("other") == 5
    assert computed == ["bulk", "bulk", "other", "bulk"]  # outside: once, then kept


@pytest.mark.parametrize(
    "text",
    [
        "I've updated your delivery address to 4 Station Road, Exeter MB11 3RH.",
        "We moved: 10 Fern Grove, London SW1A 2AA from Monday",
        "Ship it to 24 Sussex Drive, Ottawa K1A 0B1 please",
    ],
)
def test_a_postcode_is_part_of_an_address_never_a_product_key(text: str) -> None:
    assert extract_entities(text) == []
