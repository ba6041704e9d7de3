"""Chat requests written for this project: a prompt set in the shape of the paper's UltraChat sample.

**What it is.** The paper measured its targets on 500 random UltraChat-200k first turns with at
least 64 prompt tokens once chat-templated, decoding 128 greedy steps each. UltraChat cannot be
downloaded where this companion is built, so this module *writes* a set of ordinary chat
requests in that shape: what people ask a chat assistant, each with some context and a
constraint or two, as users write them ("I'm preparing ... Could you ..."). It is not a closed
world: requests are open-ended, the answers are the model's own.

**How it was written.** By this project's authors, by hand: for each kind of request a short
list of items (topics, situations, questions, code tasks, role-play setups, twenty short
passages of our own for the passage-based kinds) and a few phrasings and constraints; every
produced request is an item in one of its phrasings. Which phrasings each item gets is drawn by
a ``random.Random`` seeded from the kind's name (through sha256, so no interpreter hash seed is
involved), round-robin over the items so every item is used about equally; the word problems'
numbers are drawn the same way. :func:`chat_requests` returns the same list on every call and
machine; ids are ``chat-NNNN-<kind>`` in that order.

============== ===== ========================================================================
kind           count what
============== ===== ========================================================================
writing           60 poems, stories, emails and letters, speeches and toasts, descriptions, blog posts
open-question     60 opinion and "why" questions with no single answer
explanation       60 how something works, in plain language
advice            60 a personal or work situation and a question about it
arithmetic        60 word problems with seeded numbers (shopping, travel, recipes, rates, ages)
code              60 small functions in four languages; SQL, shell, regex, debugging, tests
summarise         60 summarise a passage given in the prompt
extract           60 pull dates, numbers, names or facts out of a passage given in the prompt
translation       60 short messages into six languages, and five messages into English
rewriting         60 simplify, shorten, restyle or correct a passage or a draft given in the prompt
roleplay          60 a role-play setup (interview practice, language practice, fiction)
============== ===== ========================================================================

660 requests in all, no two identical.

**The split.** Requests that share an *item* (the same passage, topic, code task, setup or
word-problem template, phrased differently) are a *group*, and a group lies wholly on one side:
otherwise a held-out request would differ from a training one only in its wording, which is
the leak the closed-world pair's held-out prompts had. Groups form pools: the shared passages
(used by summarise, extract and rewriting) are one pool, and each kind's other items are a pool
of their own. Within a pool, groups are ranked by ``sha256(f"split:{group}")`` and the first
half (rounded up) is ``"heldout"``, the rest ``"train"``: every kind has both, and about half of
its requests are held out (see the tests). **No drafter training may read a held-out request.**

**The 64-token rule.** A request's prompt is its text as one user turn in the target
tokenizer's chat template with the generation prompt (SmolLM2's template adds its default
system turn); :func:`build_prompt_set` refuses any request under 64 tokens there, as the paper's
selection did. In SmolLM2's template the requests have 70 to 174 tokens, median 100 (30 of them are
the template's own, 21 of those its system turn); the passage kinds are the longest. The committed ``prompts.jsonl`` (``companion.assets.CHAT_REQUESTS_DIR``) holds
every request of both splits in SmolLM2-135M-Instruct's template, ``source`` =
``chat-requests:<kind>:<split>``; rebuild it with
``python -m companion.chat_requests --tokenizer DIR``.

**The default build** takes :func:`default_subset` of the held-out split: a fixed, seeded sample
spread over the kinds. The committed file lists the held-out requests first, in that order, then
the training split (:func:`asset_order`), so the first ``n`` prompts are that sample; the prompt
set ``chat-requests-train`` (:mod:`companion.prompts`) is the training split alone.

**Comparability.** This is this project's own text, not UltraChat. Results on it are
comparable to the paper's in shape (chat requests of the same length class, templated the same
way, decoded the same number of greedy steps), not in content: how concentrated a model's next
tokens are depends on what is asked, and our mix of kinds is our choice.
"""
from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from companion import atomic
from companion.assets import CHAT_REQUESTS_DIR
from companion.prompts import Prompt, dumps_prompts

#: The kinds of request, in the order the set lists them.
KINDS: tuple[str, ...] = ("writing", "open-question", "explanation", "advice", "arithmetic", "code",
                          "summarise", "extract", "translation", "rewriting", "roleplay")
#: Requests written per kind.
PER_KIND = 60
#: The paper's selection rule: at least this many prompt tokens once chat-templated.
MIN_TOKENS = 64
# The committed prompt file (every request, both splits, SmolLM2's template).
ASSET_FILE: Path = CHAT_REQUESTS_DIR / "prompts.jsonl"
SPLITS = ("train", "heldout")
SOURCE_PREFIX = "chat-requests"
PASSAGE_POOL = "passage"


@dataclass(frozen=True)
class ChatRequest:
    """One user request: stable id, kind, the user's text, its split, and its item group."""

    request_id: str
    kind: str
    text: str
    split: str
    group: str


# ---------------------------------------------------------------------------------------------
# Content. Everything below is written for this project; names of people, places, firms and
# studies in the passages are invented.
# ---------------------------------------------------------------------------------------------

#: Passages of our own (2-5 sentences, each with people or organisations and numbers or dates),
#: shared by the summarise, extract and rewriting kinds.
PASSAGES: tuple[str, ...] = (
    "The town council of Millbrook voted on Tuesday to close Elm Street to cars on Sundays from May to "
    "September. The trial, proposed by councillor Ruth Okafor, will cost about 18,000 pounds, mostly for signs "
    "and temporary barriers. Shop owners are divided: the bakery expects more customers, while the hardware "
    "store worries about deliveries. A review is planned for October, when residents will be asked to vote in "
    "an online survey.",
    "At the project meeting on 14 March, the team agreed to move the launch of the mobile app from April to the "
    "first week of June. Priya Shah reported that 23 of the 31 planned features are complete, but the payment "
    "module still fails two security checks. Tom Becker will hire an external tester for three weeks, with a "
    "budget of 6,000 euros. The next meeting is on 28 March at 10 a.m.",
    "I bought the Corvo K2 coffee grinder in January for 89 dollars after my old one broke. It is quiet and "
    "grinds evenly for filter coffee, though the finest setting is still too coarse for espresso. After two "
    "months of daily use, the plastic lid has a small crack near the hinge. The manufacturer, Corvo Appliances, "
    "replaced it free of charge within a week.",
    "Researchers at Northfield University followed 1,200 adults for five years to study how daily walking "
    "affects sleep. Participants who walked at least 7,000 steps a day fell asleep on average 14 minutes faster "
    "than those who walked fewer than 3,000. The effect was strongest in people over sixty. The authors, led by "
    "Dr Kadri Tamm, caution that the study shows an association, not proof that walking causes better sleep.",
    "The Harbour Bridge in the city of Castlemere was opened in 1932 after six years of construction. About "
    "1,400 workers built it, and the chief engineer, Margaret Lyle, was one of the first women in the country "
    "to lead a project of that size. The bridge carried trams until 1961, when the tram network was closed. "
    "Today around 40,000 vehicles cross it every day.",
    "Greenleaf Foods announced on Monday that it will stop using plastic trays for its fresh fruit by the end "
    "of 2025. The company, which sells produce in about 300 stores, says the change will remove roughly 900 "
    "tonnes of plastic a year. Chief executive Daniel Moreau said the new cardboard trays cost slightly more, "
    "but that customers had asked for the change. Environmental groups welcomed the news but urged the company "
    "to set a similar target for its bottled drinks.",
    "Dear parents, the school trip to the Riverside Science Museum will take place on Thursday 9 May. The coach "
    "leaves at 8:30 a.m. and returns at about 3:45 p.m. The cost is 12 pounds per pupil, payable by 26 April "
    "through the school's online system. Please provide a packed lunch, and let Mrs Patel know of any "
    "allergies or medical needs.",
    "The Westfield Rovers women's team won the regional cup final on Saturday, beating Ashton City 3-1 in front "
    "of 2,800 spectators. Captain Leah Morgan scored twice in the second half after the team had been a goal "
    "down at half-time. It is the club's first trophy since 2009. Coach Samir Haddad said the win was the "
    "result of three years of patient work with young players.",
    "We spent four days in the mountain village of Valdoro in late September. The hike to Lake Serra took us "
    "about five hours there and back, with a climb of 800 metres, and the view from the top was worth every "
    "step. Our guesthouse, run by a couple called Marco and Elena, served breakfast with homemade jam and cheese "
    "from a nearby farm. The only downside was the bus from the train station, which runs just twice a day.",
    "The Oakridge Medical Centre will start offering evening appointments on Tuesdays and Thursdays from "
    "1 February. Appointments will be available between 6 p.m. and 8 p.m. and can be booked online or by phone. "
    "The centre's manager, Helen Brooks, said the change responds to a survey in which 62 per cent of patients "
    "said they found it hard to attend during working hours. Two additional nurses have been hired to cover the "
    "new sessions.",
    "Version 4.0 of the open-source photo editor Lumen was released on 2 October after eighteen months of "
    "development. The update adds layers, a new brush engine and support for RAW files from more than 150 "
    "cameras. The project's lead developer, Ana Costa, thanked the 73 volunteers who contributed code. Users on "
    "older computers have reported that the program starts more slowly than version 3, and a fix is promised "
    "for November.",
    "Riverside Credit Union reported a profit of 2.4 million dollars for last year, up from 1.9 million the "
    "year before. Membership grew by 8 per cent, to about 41,000 people, mostly because of a new savings account "
    "for young people. Chief financial officer Grace Liu said the union would use part of the profit to lower "
    "fees on small business loans. The annual general meeting will be held on 15 June in the town library.",
    "Volunteers counted 214 hedgehogs in the gardens of Linfield during a survey last summer, compared with 151 "
    "five years ago. The survey, run by the Linfield Wildlife Trust, asked residents to leave small gaps in "
    "their fences so that hedgehogs could move between gardens. Project leader Owen Price believes these gaps "
    "made the biggest difference. The trust plans to repeat the count in 2026 and to extend it to the "
    "neighbouring town of Harcourt.",
    "The Northgate Film Festival will show 48 films from 19 countries over ten days in November. This year's "
    "opening film is 'The Salt Road', a documentary by the director Yusuf Demir about traders crossing the "
    "desert. Tickets cost between 7 and 11 pounds, and students get a 30 per cent discount. For the first time, "
    "five screenings will include live audio description for blind and partially sighted viewers.",
    "From 1 July, staff at Brightline Insurance may work from home up to three days a week. Teams must agree "
    "on at least one shared office day so that meetings can happen in person. Human resources director Claire "
    "Dubois said the policy follows a six-month trial in which 85 per cent of employees reported being at least "
    "as productive as before. Managers will review the arrangement in January.",
    "The new cycle lane along Harbour Road, which cost 1.2 million pounds, opened on 3 April. It runs for 2.5 "
    "kilometres and is separated from traffic by a low kerb. In its first month, counters recorded an average "
    "of 1,150 cyclists a day, nearly double the figure before the lane was built. Local taxi drivers, "
    "represented by Bill Turner, have complained that the road now has fewer places to stop and pick up "
    "passengers.",
    "Nadia Rahman opened her small restaurant, Saffron Lane, in 2019 with just eight tables. Her best-known dish "
    "is a slow-cooked lamb stew that takes six hours to prepare and uses spices her grandmother sends from "
    "Dhaka. During the 2020 lockdowns she turned the restaurant into a takeaway and kept all four of her staff "
    "employed. Last month Saffron Lane was named the city's best small restaurant by the Evening Courier.",
    "The Fernhill Astronomy Club will hold a public stargazing night on Friday 18 October at Fernhill Country "
    "Park. Members will set up six telescopes, and if the sky is clear, visitors should be able to see Saturn's "
    "rings and the Andromeda galaxy. The event starts at 7 p.m. and is free, though donations to the club's new "
    "telescope fund are welcome. Club chair Peter Nwosu advises visitors to bring warm clothes and a torch with "
    "a red filter.",
    "Hello, I'm writing about order number 58213, which I placed on 2 September. The blue rain jacket arrived in "
    "size M, but I ordered size L, and the invoice also shows size L. I would like to exchange it rather than "
    "get a refund, and I can post the jacket back this week. Could you let me know how to arrange the return? "
    "Best wishes, Joanna Kowalski",
    "A three-year trial by the Eastvale Farming Cooperative tested whether planting clover between rows of wheat "
    "reduces the need for fertiliser. On the 40 fields in the trial, farmers used 30 per cent less nitrogen "
    "fertiliser and harvested almost the same amount of wheat. The cooperative's agronomist, Dr Sanjay Mehta, "
    "said that the savings came to about 45 pounds per hectare each year. Some farmers found the clover harder "
    "to manage in wet springs.",
)

# Writing: (context, what to write, constraints that fit it).
_POEM = ("It doesn't need to rhyme, but I'd like a clear rhythm.", "Please keep it to three or four short stanzas.",
         "I'd prefer simple words over fancy ones.", "Please end on a hopeful note.")
_STORY = ("Please keep it under 400 words.", "I'd like it to end with a small twist.",
          "Please write it in the first person.", "Please give it a title as well.")
_LETTER = ("Please keep it under 150 words.", "The tone should be friendly but professional.",
           "Please leave placeholders in square brackets for names and dates.",
           "I'd like it to sound natural, not like a template.")
_SPEECH = ("It should take about two minutes to read aloud.", "Please include one light joke.",
           "Please keep it heartfelt without being sentimental.",
           "Please avoid anything that could embarrass the people involved.")
_BLURB = ("Please keep it under 120 words.", "Please avoid exaggerated claims.",
          "Please suggest a short headline as well.", "The tone should be warm and down to earth.")
_POST = ("Please aim for about 300 words.", "Please use a conversational tone.",
         "Please include a few subheadings.", "Please end with a question to the reader.")
WRITING: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("My grandmother just turned ninety and still tends her vegetable garden every morning. She grows runner "
     "beans, tomatoes and far too many courgettes, and gives most of them away to the neighbours.",
     "a short poem about her garden that I can read aloud at her birthday lunch", _POEM),
    ("I'm putting together a small zine for our cycling club. Most of our members commute by bike all year "
     "round, so the theme of this issue is bad weather.",
     "a poem about riding home in the rain after a long day", _POEM),
    ("I teach a class of eight-year-olds, and we're starting a unit on the seasons next week. I like to open "
     "each unit with a short poem that we read together every morning.",
     "a poem about the first frost of autumn that they could learn by heart", _POEM),
    ("My best friend is moving to another country next month for a new job. We've known each other since "
     "primary school, and I'm not good at saying these things out loud.",
     "a poem about friendship and distance that I could put in a card", _POEM),
    ("Our library is running a poetry competition on the theme of small things. Entries can be at most twenty "
     "lines, and I want to try something quiet and everyday.",
     "a poem about a cup of tea going cold on a desk", _POEM),
    ("I work night shifts at a hospital and want something for our staff room wall. The team has had a hard "
     "winter, and I'd like to give them something gentle to read on their breaks.",
     "a poem about the quiet hours between three and five in the morning", _POEM),
    ("I'm running a creative writing workshop for adults and need an example to discuss. This week we're "
     "looking at how to build suspense in a very small space.",
     "a very short story about a lighthouse keeper who receives an unexpected letter", _STORY),
    ("My daughter is five and loves dragons, but she's scared of the dark. I'd like a story that helps her feel "
     "braver at bedtime without making her fear sound silly.",
     "a bedtime story about a small dragon who is afraid of the dark", _STORY),
    ("I'm entering a flash fiction contest where the theme is the last train. The limit is 500 words, and the "
     "judges like stories with a strong sense of place.",
     "a short piece of flash fiction set on the last train of the night", _STORY),
    ("Our book club wants to try writing something together and needs a starting point. After your opening, "
     "each member will continue the story for a page.",
     "the opening of a mystery story set in a small seaside bakery", _STORY),
    ("I'm designing a cooperative board game set on a space station orbiting Jupiter. Each character card has "
     "a short backstory printed on the back.",
     "a short backstory for the station's chief engineer, who is hiding a secret", _STORY),
    ("For a history project, my students are writing fiction set in the past. They are thirteen, and I want to "
     "show them a model story before they start their own.",
     "a short story about a child's first day working in a nineteenth-century textile mill", _STORY),
    ("I ordered a desk online three weeks ago and it still hasn't arrived, although the website promised "
     "delivery within five working days. I've already sent one message through their contact form and heard "
     "nothing back.",
     "an email to the shop's customer service asking for an update or a refund", _LETTER),
    ("I've been offered a job at an engineering firm, but I need two more weeks to decide because of a family "
     "matter. I don't want to lose the offer or seem uninterested.",
     "an email to the recruiter asking for an extension", _LETTER),
    ("Our neighbours' dog barks for hours while they are at work, and I work from home. We get on well with "
     "them, so I want to raise it kindly.",
     "a note I could leave in their letterbox", _LETTER),
    ("I coordinate volunteers for a food bank, and we need more help on Saturday mornings. Demand has gone up "
     "by about a third since the autumn, and several of our regular volunteers have moved away.",
     "an email to our mailing list asking for volunteers", _LETTER),
    ("A colleague covered my shifts for a whole week while I was ill with flu. She didn't have to, and it meant "
     "working two late nights in a row.",
     "a thank-you message I could send her", _LETTER),
    ("The boiler in my rented flat has been broken for four days, and it's getting cold. I reported it by "
     "phone on the first day, but nobody has come to look at it yet.",
     "an email to my landlord asking for it to be repaired urgently", _LETTER),
    ("I'm applying for a part-time job at a local bookshop while I finish my degree. I have two years of retail "
     "experience, and I read constantly, mostly crime novels and history.",
     "a short cover letter for the application", _LETTER),
    ("My sister is getting married in June, and I'm the maid of honour. She met her fiance on a rainy camping "
     "trip where everything went wrong.",
     "a toast for the wedding reception", _SPEECH),
    ("Our team lead is retiring after twenty-five years at the company. She hired most of us and is famous for "
     "her terrible puns and her homemade cakes.",
     "a short farewell speech I can give at her leaving party", _SPEECH),
    ("I'm the captain of an amateur football team that has just lost the league final on penalties. Everyone "
     "is gutted, but it was still our best season in years.",
     "a short speech to the team for our end-of-season dinner", _SPEECH),
    ("As chair of the parents' association, I've been asked to open our school's science fair. About two "
     "hundred families are expected, and the children have been working on their projects for weeks.",
     "a short welcome speech for the opening", _SPEECH),
    ("My father is turning sixty, and the whole family is getting together for dinner. He's a retired postman "
     "who still walks ten kilometres a day and tells the same three stories at every gathering.",
     "a toast to him for the dinner", _SPEECH),
    ("I run a small bakery that has just started making sourdough bread with flour from a local mill. Each "
     "loaf proves for twenty-four hours, and we bake only forty a day.",
     "a description of the new bread for our website", _BLURB),
    ("I'm selling my old road bike, a ten-year-old steel frame in good condition. It has new tyres and was "
     "serviced last month, but the paint is scratched in a few places.",
     "a listing for a second-hand marketplace", _BLURB),
    ("Our community garden is opening a tool library where members can borrow equipment. We have about sixty "
     "tools so far, from spades to a lawn aerator, all donated by residents.",
     "a short announcement for the neighbourhood newsletter", _BLURB),
    ("I make ceramic mugs in a small studio in my garage, and I'm about to open an online shop. Every mug is "
     "thrown on the wheel and glazed by hand, so no two are quite the same.",
     "an 'about us' paragraph for the shop", _BLURB),
    ("Our hostel has just renovated its shared kitchen and rooftop terrace. Most of our guests are backpackers "
     "in their twenties, and the terrace looks out over the old harbour.",
     "a short description for our booking page", _BLURB),
    ("I keep a blog about living on a small budget, and my readers are mostly students and young families. "
     "This month's theme is food.",
     "a post about cooking a week of dinners from one big shopping trip", _POST),
    ("I'm writing for our company's internal newsletter this month. Many people in our office eat at their "
     "desks or skip lunch altogether.",
     "a short article about why taking a proper lunch break matters", _POST),
    ("I'm starting a blog about learning to play the piano as an adult. I'm forty-eight, had lessons as a "
     "child, and gave up when I was twelve.",
     "the first post, introducing myself and explaining why I started again", _POST),
    ("Our local walking group has a website with a page of members' stories. We walk every Sunday, whatever "
     "the weather, and most of us are retired.",
     "a short piece about a winter walk along the river", _POST),
)
_WRITING_ASKS = ("Could you write {}?", "Would you help me write {}?", "I'd be grateful if you could draft {}.")

# Open questions: (question, two contexts that stand on their own).
_OPEN_CONSTRAINTS = ("Please give a few concrete examples.", "A few paragraphs would be plenty.",
                     "I'd appreciate it if you pointed out where the answer is still debated.",
                     "Please explain your reasoning rather than just listing points.")
OPEN_QUESTIONS: tuple[tuple[str, tuple[str, str]], ...] = (
    ("Do you think remote work is better or worse for young people at the start of their careers?",
     ("My friends and I had a long argument about this over dinner last night, and I'd like an outside view.",
      "I'm about to start my first job after university and can choose between an office role and a remote one.")),
    ("Why did so many ancient civilisations build pyramids or pyramid-like structures?",
     ("I was watching a documentary about Mesoamerica last night, and it got me wondering.",
      "My nephew asked me this at the weekend, and I realised I had no good answer.")),
    ("Is it still worth learning a foreign language now that translation apps are so good?",
     ("I'm forty-two and thinking about taking evening classes in Italian, but my son says it's a waste of time.",
      "Our school is debating whether to cut its language programme, and I'm on the parents' panel.")),
    ("What makes some cities pleasant to walk around while others feel hostile to pedestrians?",
     ("I've just come back from a trip to Copenhagen and Lisbon, and the difference from my home town struck me.",
      "I sit on a neighbourhood committee that is discussing improvements to our high street.")),
    ("Why do people enjoy horror films when being scared is unpleasant?",
     ("My partner loves horror films, and I have never understood the appeal.",
      "I'm writing an essay for a psychology course and want to explore some ideas before reading the research.")),
    ("Should museums return artefacts that were taken from other countries during the colonial era?",
     ("This came up in a seminar last week, and I couldn't decide what I think.",
      "I visited a big national museum recently, and the labels on some of the objects made me uneasy.")),
    ("What are the biggest obstacles to getting people to eat less meat?",
     ("I work for a small charity that promotes plant-based cooking in schools and community centres.",
      "I've been trying to cut down myself, and I'm finding it surprisingly hard.")),
    ("How has the smartphone changed the way families spend their evenings together?",
     ("My parents often say that evenings at home were very different when I was a child.",
      "I'm preparing a discussion topic for an evening sociology class that I teach.")),
    ("Is it fair that top professional athletes earn so much more than nurses or teachers?",
     ("A colleague brought this up at lunch, and everyone at the table had a different opinion.",
      "My teenage son asked me this after seeing a record football transfer on the news.")),
    ("What would be lost if schools stopped teaching handwriting altogether?",
     ("I'm a primary school teacher, and our head is considering cutting handwriting lessons.",
      "I realised recently that I hardly ever write anything by hand any more, apart from birthday cards.")),
    ("Why do some songs get stuck in our heads for days?",
     ("A jingle from a television advert has been looping in my head all week.",
      "I'm a music student, and I'm curious about what the research says on this.")),
    ("Is space exploration a good use of public money when there are so many problems on Earth?",
     ("My debating club has this as next month's motion, and I haven't picked a side yet.",
      "I watched a rocket launch online with my kids, and one of them asked how much it cost.")),
    ("What makes someone a really good teacher?",
     ("I'm starting teacher training in September, after ten years of working in an office.",
      "I've been thinking about the two or three teachers who changed my life, and I want to understand why.")),
    ("Why have games like chess and go stayed popular for hundreds of years while most games fade?",
     ("I joined a chess club at sixty-five, and I'm completely hooked.",
      "I design board games as a hobby and wonder what gives a game real staying power.")),
    ("Should voting be compulsory, as it is in Australia?",
     ("Turnout at our last local election was under thirty per cent, and people keep complaining about the "
      "result.", "I'm writing an opinion piece on this for my university newspaper.")),
    ("What are the main advantages and drawbacks of a four-day working week?",
     ("My company is considering a trial of a four-day week next year.",
      "I run a small design studio with six employees, and I'm curious whether it would work for us.")),
    ("Why is it so hard for people to change their minds, even when they are shown good evidence?",
     ("I had a frustrating conversation with a relative over the holidays.",
      "I volunteer for a public health campaign and keep running into this problem.")),
    ("How will cities need to change to cope with much hotter summers?",
     ("Last summer my top-floor flat was unbearably hot for weeks.",
      "I'm an architecture student choosing a topic for my final project.")),
    ("What makes a novel a classic rather than just a bestseller of its time?",
     ("My book club keeps arguing about which of our picks will still be read in fifty years.",
      "I'm teaching an evening class on literature for adults this autumn.")),
    ("Is tourism good or bad for small historic towns?",
     ("I grew up in a small walled town that now has more visitors than residents in summer.",
      "I'm planning a trip to a famous medieval village and feel a bit guilty about adding to the crowds.")),
    ("Why do people collect things such as stamps, coins or trainers?",
     ("My husband has over four hundred vinyl records and keeps buying more.",
      "I'm curating a small exhibition about collectors at our local museum.")),
    ("Should children be allowed to use social media before the age of thirteen?",
     ("My eleven-year-old says that everyone in her class already has an account.",
      "Our school council is drafting advice for parents on this.")),
    ("What did governments and ordinary people learn from the COVID-19 pandemic, and what did they fail to learn?",
     ("I'm writing a reflective piece for a public health course.",
      "Some friends and I were talking about how quickly everything went back to normal.")),
    ("Why do most people find landscapes such as mountains, coastlines and forests beautiful?",
     ("I'm a landscape photographer, and I've started to wonder what makes a view appealing.",
      "I've just come back from a hiking holiday, and the scenery moved me more than I expected.")),
)

# Explanation: (context, concept).
_AUDIENCE = ("in plain language", "without assuming any technical background", "in simple terms")
_EXPLAIN_ASKS = ("Could you explain {concept}, {audience}?", "Can you help me understand {concept}, {audience}?")
_EXPLAIN_CONSTRAINTS = ("An everyday analogy would help a lot.", "Please walk through it step by step.",
                        "Please keep it to a few short paragraphs.",
                        "Please also mention a common misconception about it.")
EXPLANATIONS: tuple[tuple[str, str], ...] = (
    ("My son is getting his vaccinations next week and keeps asking questions. He's nine and wants to know how "
     "a tiny injection can stop him getting ill.", "how vaccines train the immune system"),
    ("We're about to buy our first flat, and the bank's documents confuse me. We've been offered a 25-year "
     "mortgage with a fixed rate for the first five years.",
     "how the interest on a mortgage is calculated over the life of the loan"),
    ("I'm a teaching assistant at a primary school, and a child asked me this today. I gave a vague answer and "
     "want to do better tomorrow.", "why the sky is blue but sunsets are red"),
    ("The news keeps talking about interest rates, and I feel lost. My savings account and my credit card both "
     "seem to be affected.", "what inflation is and why central banks raise interest rates to fight it"),
    ("Our fridge broke last week, and the repair person kept mentioning the compressor. I nodded along but had "
     "no idea what he meant.", "how a refrigerator keeps food cold"),
    ("I've just started a job in IT support, and this topic keeps coming up. People talk about keys, "
     "certificates and the padlock in the browser as if it were obvious.",
     "how public-key encryption lets two strangers communicate securely"),
    ("Everyone at work talks about AI, and I'd like to understand the basics. I work in accounts and haven't "
     "studied any maths since school.", "what a neural network is and how it learns from examples"),
    ("We're going sailing along the coast this summer. The harbour master told us to plan every trip around "
     "the tide tables.", "how the Moon and the Sun cause the tides"),
    ("My niece was born on 29 February and wants to know why her birthday is special. She's turning eight but "
     "says she has only had two real birthdays.", "why we have leap years"),
    ("I'm studying for a first-aid course. The manual assumes I already know how the circulation works, and I "
     "don't.", "how the heart pumps blood around the body"),
    ("I've just opened my first savings account at twenty-two. My parents keep telling me that starting now "
     "matters more than the amount.", "what compound interest is and why people say to start saving early"),
    ("I'm helping my daughter revise for a biology test on Friday. Her textbook is very dry, and she learns "
     "best from a clear story.", "how photosynthesis works"),
    ("I've recently become a citizen, and I want to understand how laws are made here. I'd like to follow the "
     "debates in parliament without feeling lost.", "how a bill becomes law in a parliamentary system"),
    ("I'm moving to a city that has frequent small earthquakes. The estate agent said they are nothing to worry "
     "about, but I'd like to understand them.", "what causes earthquakes and why some regions get so many"),
    ("I've just bought a pair of noise-cancelling headphones for my commute. They make the train almost silent, "
     "which seems like magic.", "how noise-cancelling headphones work"),
    ("I'm giving a short talk about the climate at my local library. The audience will be a mix of ages, and "
     "most will have no science background.", "what the greenhouse effect is"),
    ("I got lost hiking last weekend, and the map on my phone got me home. It worked even though I had no "
     "mobile signal up in the hills.", "how GPS works out where my phone is"),
    ("My colleague keeps recommending index funds. Whenever I ask what that means, he just says they follow "
     "the market.", "what a stock index such as the S&P 500 actually measures"),
    ("I've started baking bread at home, and some of my loaves come out flat. I follow the recipe carefully, so "
     "I want to understand what is going on inside the dough.", "how yeast makes bread rise"),
    ("My doctor told me that antibiotics would not help with my cold. I was surprised, because a friend of mine "
     "always asks for them when she is ill.", "how antibiotics work and why they don't help with colds"),
    ("I'm taking an evening course in web design. We're building our first sites, but the teacher skipped over "
     "what happens behind the scenes.", "how a web page gets from a server to my laptop when I type an address"),
    ("My son dropped an ice cube into a glass of water and asked why it didn't sink. I then realised that most "
     "solids sink in their own liquid, so ice seems odd.", "why ice floats on water"),
    ("I'm taking my first economics module at college. The lecturer moves quickly, and the graphs in the "
     "textbook haven't clicked for me yet.", "supply and demand, using house prices as the example"),
    ("I'm teaching my daughter to ride a bike. She wobbles when she goes slowly but is steady once she picks up "
     "speed.", "why a moving bicycle stays upright"),
    ("I have exams in a month, and I keep staying up late to revise. A friend told me I'd remember more if I "
     "slept properly.", "how sleep affects memory"),
    ("We watched a film about space last night, and my teenage son had a lot of questions. I could only answer "
     "half of them.", "what a black hole is"),
    ("We're thinking about putting solar panels on our roof. The installer gave us a quote, but I'd like to "
     "understand how they actually work first.", "how solar panels turn sunlight into electricity"),
    ("I'm following the United States presidential election from abroad. I don't understand how a candidate "
     "can win the most votes and still lose.", "how the electoral college works"),
)

# Advice: (situation, question).
_ADVICE_LEADS = ("", "I could use some advice.", "I hope you can help with something.")
_ADVICE_CONSTRAINTS = ("I'd appreciate practical steps rather than general encouragement.",
                       "Please be honest if you think I'm approaching it the wrong way.",
                       "A short list of options with their pros and cons would be ideal.",
                       "Please keep it realistic for someone with a busy schedule.")
ADVICE: tuple[tuple[str, str], ...] = (
    ("I've just been promoted to manage a team of five people who used to be my peers. Two of them are close "
     "friends, and one applied for the same job.", "How do I set boundaries without damaging the friendships?"),
    ("I want to start running, but I'm overweight and get out of breath after a minute or two. I'm forty-five "
     "and haven't exercised regularly since school.", "How should I begin?"),
    ("My flatmate never does the washing up, and it's starting to make me resentful. We've lived together for "
     "two years and otherwise get on really well.", "How can I bring it up without starting a fight?"),
    ("I'm thirty-five and thinking about changing careers from accounting to teaching. It would mean a year of "
     "training and a pay cut for a few years.", "What should I consider before making the jump?"),
    ("I have an interview for a data analyst role on Friday, and I get very nervous in interviews. Last time my "
     "mind went blank on a simple question.", "How can I prepare so that my nerves don't take over?"),
    ("My elderly father lives alone two hours away and is becoming forgetful. He's proud and insists that he "
     "doesn't need any help.", "How can I support him from a distance?"),
    ("I've saved about three months of expenses and want to start investing, but I know very little about it. "
     "I'm twenty-eight and have no debts apart from a small car loan.", "What are sensible first steps?"),
    ("My twelve-year-old spends most evenings gaming, and her grades are slipping. When I raise it, she says "
     "all her friends play just as much.", "How can I set limits without making her feel punished?"),
    ("I'm moving to Berlin for work in two months, and I don't speak any German. The job is in English, but I'd "
     "like to feel at home in the city.", "How should I prepare for the move?"),
    ("I keep procrastinating on my dissertation, and the deadline is in six weeks. I've written about a third "
     "of it and feel overwhelmed whenever I open the file.", "How can I get back on track?"),
    ("I adopted a rescue dog last month, and he gets anxious whenever I leave the house. He barks and scratches "
     "at the door, and the neighbours have started to notice.", "What can I do to help him settle?"),
    ("I'm planning a week-long trip to Japan in the spring on a moderate budget. It's my first time in Asia, "
     "and I'd like a mix of cities and countryside.", "How should I plan the itinerary?"),
    ("I've been asked to present our quarterly results to senior management for the first time. I know the "
     "numbers well, but I tend to rush when I'm nervous.", "How can I come across as clear and confident?"),
    ("My houseplants keep dying even though I water them regularly. The leaves turn yellow and droop within a "
     "few weeks of buying them.", "What might I be doing wrong?"),
    ("I run a small online shop selling handmade jewellery, and sales have dropped by a third since last year. "
     "My prices and products haven't changed.", "Where should I look first?"),
    ("I've moved to a new city where I don't know anyone, and I'm finding it hard to make friends. I work from "
     "home, so I don't meet people through my job.", "How can I meet people?"),
    ("I want to spend less time on my phone, especially in the hour before bed. I often scroll until after "
     "midnight and then feel tired all morning.", "What tends to work for people?"),
    ("My partner and I want to buy a house within three years, but we both have student loans. Together we "
     "earn a decent income, but we rent in an expensive area.", "How should we plan our savings?"),
    ("I've been offered two jobs: one pays more, and the other has a shorter commute and a friendlier team. "
     "The better-paid one would mean about ninety minutes of travel each day.",
     "How should I decide between them?"),
    ("I'm a new manager, and one person on my team often misses deadlines. His work is good when it arrives, "
     "and I don't want to demotivate him.", "How should I handle the conversation with him?"),
    ("I'd like to grow vegetables on my small balcony, which only gets sun in the afternoon. I've never grown "
     "anything before, apart from a basil plant that died.", "What should I plant, and how should I start?"),
    ("I'm afraid of flying, but I need to fly to my brother's wedding in three months. The flight is about "
     "seven hours, and I haven't flown in ten years.", "How can I cope with the flight?"),
    ("I'm a university student on a tight budget, and I spend far too much on takeaways. I have a small "
     "kitchen that I share with three other people.", "How can I eat well for less?"),
    ("My team at work uses five different chat and email tools, and important messages get lost. Last week a "
     "client's request went unanswered for three days because of it.",
     "How could we simplify the way we communicate?"),
    ("I started learning the guitar at forty, and my progress feels slow. I practise for about twenty minutes "
     "most evenings, mostly by playing songs I already know.", "How can I practise more effectively?"),
    ("My younger brother wants to drop out of university to start a business. He's in his second year of "
     "engineering and has an idea for a cycling app.",
     "How can I talk to him about it without sounding like a parent?"),
)

# Code: function tasks (one group each, asked in one of four languages), then requests that stand alone.
_CODE_LANGUAGES = ("Python", "JavaScript", "Go", "Java")
_CODE_CONTEXTS = ("I'm learning {lang} in the evenings and practising with small exercises.",
                  "I'm working on a small side project in {lang} and need a helper for it.",
                  "I'm preparing for a coding interview next week, and I'll be using {lang}.")
_CODE_CONSTRAINTS = ("Please include a couple of example calls with their expected output.",
                     "Please explain how it works after the code.",
                     "Please make sure it handles edge cases sensibly.",
                     "I'd like it to be readable rather than clever.")
CODE_FUNCTIONS: tuple[str, ...] = (
    "checks whether a string is a palindrome, ignoring spaces, punctuation and letter case",
    "returns the n-th Fibonacci number without using recursion",
    "counts how often each word appears in a piece of text and returns the five most common words",
    "merges two sorted lists of integers into one sorted list",
    "checks that a password has at least twelve characters, including one digit and one uppercase letter",
    "removes duplicate entries from a list while keeping the original order",
    "finds the second largest number in a list of integers",
    "checks whether two words are anagrams of each other",
    "formats a number of seconds as hours, minutes and seconds, so that 3725 becomes 1:02:05",
    "returns all the prime numbers below a given limit using the sieve of Eratosthenes",
    "reverses the order of the words in a sentence",
    "checks whether a given year is a leap year",
    "performs a binary search on a sorted list and returns the index of the target, or -1 if it is absent",
    "converts a Roman numeral such as XIV into an integer",
)
_CODE_CLOSERS = ("I'm still fairly new to programming, so please don't skip steps.",
                 "A short explanation of why it works would be great.",
                 "Please keep the answer focused; I don't need several alternatives.")
CODE_REQUESTS: tuple[str, ...] = (
    "I have a PostgreSQL table orders(id, customer_id, amount, created_at). Could you write a query that returns "
    "each customer's total spending in 2023, sorted from highest to lowest, and only includes customers who "
    "spent more than 500?",
    "I have a folder full of photos with names like IMG_1234.JPG. Could you write a Bash script that renames "
    "them to lowercase and adds each file's modification date, as YYYY-MM-DD, to the front of the name?",
    "This Python function is supposed to return the average of a list, but it sometimes crashes:\n\n"
    "def average(values):\n    return sum(values) / len(values)\n\nWhen does it fail, and how would you fix it?",
    "My JavaScript loop prints 3 three times instead of 0, 1 and 2:\n\n"
    "for (var i = 0; i < 3; i++) {\n  setTimeout(() => console.log(i), 100);\n}\n\n"
    "Why does this happen, and how do I fix it?",
    "Could you explain what this line of Python does, one piece at a time? I'm new to comprehensions.\n\n"
    "squares = {n: n * n for n in range(10) if n % 2 == 0}",
    "I need a regular expression that matches UK postcodes such as SW1A 1AA or M1 1AE. Could you write one "
    "and explain what each part of it does?",
    "I accidentally committed a large video file to my Git repository, but I haven't pushed yet. How do I "
    "remove it from the last commit while keeping my other changes?",
    "I have a CSV file of daily temperatures with the columns date, city and temp_c. Could you show me how to "
    "use pandas to compute the average temperature per month for each city?",
    "I'm building a website for my aunt's small pottery business. Could you write the HTML and CSS for a simple "
    "contact form with name, email and message fields, with the submit button centred below the fields?",
    "Could you write pytest unit tests for a function slugify(title) that lowercases a title, replaces spaces "
    "with hyphens and removes punctuation? I want to cover the tricky cases too.",
    "I'm doing an online course on object-oriented programming. Could you write a Python class for a simple bank "
    "account with deposit and withdraw methods and a balance, where withdrawing more than the balance raises an "
    "error?",
    "What is the time complexity of this Python function, and can it be made faster?\n\n"
    "def has_duplicates(items):\n    for i in range(len(items)):\n        for j in range(i + 1, len(items)):\n"
    "            if items[i] == items[j]:\n                return True\n    return False",
)

# Summarise and extract: instructions applied to a passage; two layouts.
SUMMARISE: tuple[str, ...] = (
    "I'm putting together a weekly digest for my team. Could you summarise the passage below in one or two "
    "sentences?",
    "I need to brief my manager in a few minutes. Could you give me the main points of the passage below as a "
    "short bulleted list?",
    "My grandfather finds long texts tiring to read. Could you summarise the passage below in simple language, "
    "in no more than three sentences?",
    "I'm collecting material for a report. Please write a one-sentence summary of the passage below, followed "
    "by one sentence on why it might matter to the people involved.",
)
EXTRACT: tuple[str, ...] = (
    "From the passage below, please list every date, time and number that is mentioned, and say in a few words "
    "what each one refers to.",
    "Please pull out the names of all the people and organisations in the passage below, with a short note on "
    "the role of each.",
    "I'm filling in a spreadsheet. From the passage below, please extract the key facts as 'field: value' "
    "lines, one per line.",
    "Based only on the passage below, who is involved, what has happened or is planned, and when? If the "
    "passage doesn't say, please write 'not stated'.",
)
_LAYOUTS = ("{instruction}\n\n{passage}", '{instruction}\n\nHere is the passage:\n"{passage}"')

# Rewriting: instructions for the shared passages, and drafts of our own with their own instruction.
REWRITE_PASSAGE: tuple[str, ...] = (
    "Could you rewrite the passage below so that a ten-year-old could understand it, keeping all the "
    "important facts?",
    "Please rewrite the passage below in a livelier style for a community newsletter, without adding any facts "
    "that aren't there.",
    "Could you make the passage below about half as long without losing any of the key information?",
    "Please turn the passage below into three to five bullet points that keep every figure it mentions.",
)
_REWRITE_CLOSERS = ("Please give me two versions to choose from.", "Could you also tell me briefly what you changed?",
                    "One version is enough.")
REWRITE_DRAFTS: tuple[tuple[tuple[str, str], str], ...] = (
    (("This is a message to my manager that I wrote in a hurry.", "I'm about to send this to my boss on Slack."),
     "Could you make it sound professional but still honest?\n\n"
     "hey, so the report isnt gonna be ready by friday, the sales data came in late and half of it was wrong. "
     "can we push it to tuesday? sorry!!"),
    (("Our office manager wrote this notice and asked me to tidy it up.", "I drafted this notice for the staff."),
     "Could you make it clearer and shorter?\n\n"
     "To whom it may concern. I am writing in order to inform you that the meeting which was previously "
     "scheduled to take place on the date of Wednesday has been moved, due to reasons of availability, to the "
     "date of Thursday."),
    (("English is my second language and I want this sentence in my proposal to be correct.",
      "I'm sending a proposal to my director tomorrow."),
     "Could you fix the grammar and spelling while keeping my meaning?\n\n"
     "Me and my collegue has been working on this proposal since three week, and we beleive it could save the "
     "company alot of money if it would be approved."),
    (("My teenage son wrote this message for his sports club's group chat.",
      "A volunteer wrote this reminder for our club members."),
     "Could you correct the mistakes in it?\n\n"
     "Their going to announce the team tomorrow, so everyone should of handed in there forms by tonight. If "
     "your late, it wont be counted."),
    (("I work in a university admissions office and our standard email sounds harsh.",
      "Applicants have told us that this email of ours sounds cold."),
     "Could you make it friendlier and more helpful while keeping the deadline clear?\n\n"
     "Your application is incomplete. Submit the missing documents within five days or it will be rejected."),
    (("I'm writing a review of a piece of software we tested at work.",
      "This is my first attempt at a sentence for a product review."),
     "Could you rewrite it as one or two clear, balanced sentences?\n\n"
     "The thing about the new software is that it's kind of good in some ways but also kind of not good in "
     "other ways, like it's faster but the menus are confusing and stuff."),
    (("I'm updating my CV for a marketing job.", "A friend said my CV undersells what I did at my last job."),
     "Could you turn this into a strong bullet point for my CV?\n\n"
     "I was in charge of doing the social media stuff for the cafe and I made the posts and more people started "
     "coming in, like maybe 20% more."),
    (("I'm editing the minutes of our committee meeting.", "Our committee's report has to be more direct this year."),
     "Could you rewrite this in the active voice so it is more direct?\n\n"
     "Mistakes were made in the planning of the event, and it was decided by the committee that changes would "
     "be introduced so that the problems would not be repeated next year."),
    (("I'm writing a short article for teachers, not for academics.",
      "My supervisor says my writing is too wordy."),
     "Could you put this sentence into plain English?\n\n"
     "It is widely considered by a large number of researchers in the field that the utilisation of digital "
     "tools in classroom environments may potentially have the capacity to improve student engagement levels."),
    (("I was furious when I wrote this to my internet provider.", "I need to complain to my internet provider."),
     "Could you turn it into a calm but firm complaint email?\n\n"
     "This is the THIRD time my internet has gone down this week!!! I pay every month and get nothing. Fix it "
     "now or I'm leaving."),
)

# Translation: (context with {language}/{country}/{city}, English text), into six languages; then five into English.
_LANGUAGES = (("French", "France", "Lyon"), ("Spanish", "Spain", "Madrid"), ("German", "Germany", "Munich"),
              ("Italian", "Italy", "Rome"), ("Portuguese", "Portugal", "Lisbon"),
              ("Dutch", "the Netherlands", "Amsterdam"))
_TRANSLATE_CONSTRAINTS = ("Please keep the tone natural rather than translating word for word.",
                          "If any phrase would sound odd to a native speaker, please adapt it and tell me what "
                          "you changed.",
                          "Could you also give me an English back-translation so I can check it?")
TRANSLATE_INTO: tuple[tuple[str, str], ...] = (
    ("I'm staying with a host family in {country} next month and want to send them a short message before I "
     "arrive. Could you translate it into {language}?",
     "Hello! My name is Sam, and I will arrive on Saturday afternoon by train. Thank you very much for having "
     "me. Is there anything I should bring with me from home?"),
    ("I run a small guesthouse, and many of our guests speak {language}. Could you translate this kitchen "
     "notice into {language}?",
     "Breakfast is served from 7:30 to 10:00. Please wash your cups after use, and label any food you keep in "
     "the fridge with your name and the date."),
    ("I'm writing a birthday card for a colleague from {country}. Could you translate my message into "
     "{language}?",
     "Happy birthday! Thank you for always being so patient and helpful with the new members of the team. I "
     "hope you have a wonderful day and a relaxing weekend."),
    ("Our company is starting to sell in {country}. Could you translate this short product description into "
     "{language}?",
     "This reusable water bottle keeps drinks cold for 24 hours and hot for 12. It is made of stainless steel, "
     "fits most car cup holders and is easy to clean."),
    ("I'm travelling to {country} soon and may need to see a pharmacist while I'm there. Could you translate "
     "these sentences into {language}?",
     "I have had a sore throat and a mild fever since yesterday. I am allergic to penicillin. Could you "
     "recommend something I can take without a prescription?"),
    ("I volunteer at a community centre where many visitors speak {language}. Could you translate this sign "
     "into {language}?",
     "Welcome! Free English classes take place every Monday and Wednesday at 6 p.m. Children can play in the "
     "room next door while their parents study. No registration is needed."),
    ("I'm emailing a hotel in {city} about my booking. Could you translate my message into {language}?",
     "Good morning, I have booked a double room for three nights, from 12 to 15 August. We will arrive late, "
     "around 11 p.m. Will it be possible to check in at that time?"),
    ("My grandmother only speaks {language}, and I want to leave her a note before I go out. Could you "
     "translate it for me?",
     "Grandma, I've gone to the market and will be back by noon. Your medicine is on the kitchen table. Please "
     "call me if you need anything."),
    ("I'm preparing a slide for a conference in {city}. Could you translate this summary of our study into "
     "{language}?",
     "Our study shows that small changes to school timetables, such as starting lessons thirty minutes later, "
     "can improve students' attention in the morning."),
    ("I'm selling my sofa and want to post an advert in a {language}-speaking group online. Could you "
     "translate it into {language}?",
     "Grey three-seater sofa for sale, four years old and in very good condition. No pets or smokers in the "
     "house. Collection only, from the city centre. Price: 150 euros or best offer."),
    ("A friend from {country} helped me move house last weekend, and I want to thank her in her own language. "
     "Could you translate this into {language}?",
     "Thank you so much for your help on Saturday. I couldn't have done it without you. Next time you visit, "
     "dinner is on me!"),
    ("I'm a tour guide, and some of my groups come from {country}. Could you translate this safety briefing "
     "into {language}?",
     "Please stay with the group at all times and keep your ticket with you. If you get lost, wait at the main "
     "entrance and call the number printed on your ticket."),
    ("I'm learning {language} and want to check my understanding. Could you translate these sentences into "
     "{language} and point out any grammar a beginner might find tricky?",
     "Yesterday I went to the library with my sister. We borrowed three books and then had coffee in a small "
     "cafe near the river."),
    ("Our youth football club is hosting a team from {country} next month. Could you translate our welcome "
     "message into {language}?",
     "Welcome to Westfield! We are delighted to host you this weekend. The first match starts at 10 a.m. on "
     "Saturday, and afterwards there will be a barbecue for all the players and their families."),
)
_FROM_CONSTRAINTS = ("Please also explain any expressions that don't translate directly.",
                     "Could you also suggest a short reply in the same language?")
TRANSLATE_FROM: tuple[tuple[tuple[str, str], str, str], ...] = (
    (("My French penfriend sent me this message, and my French is rusty.",
      "I received this message from a friend in Lyon and want to be sure I understand it."), "French",
     "Salut ! Merci beaucoup pour ta lettre. Je suis tr\u00e8s contente que tu viennes \u00e0 Lyon en juillet. "
     "Mes parents ont h\u00e2te de te rencontrer, et nous avons pr\u00e9vu une excursion dans les Alpes."),
    (("A new client in Madrid sent me this, and I only know a few words of Spanish.",
      "I got this email from a colleague in our Spanish office."), "Spanish",
     "Hola, te escribo para confirmar la reuni\u00f3n del martes a las diez. Por favor, trae los documentos del "
     "proyecto y av\u00edsame si necesitas cambiar la hora."),
    (("Our new neighbours in Munich put this note in our letterbox.",
      "I found this note from the neighbours on the door of our holiday flat in Germany."), "German",
     "Liebe Nachbarn, am Samstag feiern wir den Geburtstag unserer Tochter. Es k\u00f6nnte etwas lauter werden, "
     "aber wir h\u00f6ren sp\u00e4testens um zehn Uhr auf. Vielen Dank f\u00fcr Ihr Verst\u00e4ndnis!"),
    (("I ordered a lamp from an Italian shop and received this email.",
      "This email arrived after I bought something from a website in Italy."), "Italian",
     "Gentile cliente, la informiamo che il suo ordine \u00e8 stato spedito oggi e arriver\u00e0 entro tre giorni "
     "lavorativi. Per qualsiasi domanda, non esiti a contattarci."),
    (("A friend in Lisbon replied to my dinner invitation with this message.",
      "I invited some Portuguese colleagues to dinner and one of them sent this."), "Portuguese",
     "Ol\u00e1! Obrigado pelo convite para o jantar de sexta-feira. Infelizmente n\u00e3o vou poder ir, porque "
     "tenho de trabalhar at\u00e9 tarde. Espero ver-vos em breve!"),
)

# Role-play: (the assistant's role, mine, the scene).
_ROLEPLAY_LEADS = ("Let's do a role-play.", "I'd like to try a role-play exercise with you.",
                   "Could we do a short role-play?")
_ROLEPLAY_RULES = ("Please stay in character and start the conversation.",
                   "Stay in character, keep your replies fairly short, and begin by greeting me.",
                   "Please begin, and don't break character unless I write 'pause'.")
ROLEPLAYS: tuple[tuple[str, str, str], ...] = (
    ("the interviewer for a junior marketing position at a mid-sized travel company", "the candidate",
     "I have a real interview next week and want to practise answering questions about teamwork and deadlines."),
    ("a waiter in a small cafe in Paris who speaks only French", "a tourist ordering breakfast",
     "I'm learning French at a beginner level and want to practise ordering food."),
    ("a customer who is upset because their parcel arrived damaged",
     "a customer service agent at an online electronics shop",
     "I've just started a job in customer service and want to practise staying calm and helpful."),
    ("a landlord showing me a one-bedroom flat", "someone looking for a place to rent",
     "I want to practise asking the right questions before I sign a lease."),
    ("a seasoned ship's captain in the eighteenth century", "a young sailor on my first voyage",
     "I'm writing an adventure novel and want to hear how the captain might talk."),
    ("a friendly pharmacist", "a customer asking about hay fever remedies",
     "I'm practising English for everyday situations, so please speak clearly and simply."),
    ("a guide at a natural history museum", "a visitor with a curious ten-year-old",
     "We're standing in front of a dinosaur skeleton, and my son has lots of questions."),
    ("my manager", "an employee who has taken on extra responsibilities this year",
     "I want to practise asking for a pay rise before my annual review."),
    ("a detective interviewing a witness", "the witness, who saw something strange at a train station",
     "This is to try out a scene for a murder-mystery party I'm hosting."),
    ("a medieval innkeeper", "a weary traveller looking for a room for the night",
     "I'm preparing a fantasy tabletop game and want to get a feel for the tavern scene."),
    ("a taxi driver in Madrid who speaks only Spanish", "a passenger going to the airport",
     "I'm practising my Spanish for a trip and want simple, everyday conversation."),
    ("a sceptical investor on a start-up pitch panel", "a founder pitching an app that helps people share "
     "leftover food", "I have a pitch competition next month and want to rehearse tough questions."),
    ("a hotel receptionist", "a guest whose room has not been cleaned",
     "I'm training new front-desk staff and want an example conversation to show them."),
    ("a personal trainer at a gym", "a complete beginner who has never lifted weights",
     "I'm nervous about starting at the gym and want to rehearse my first session."),
    ("a senator in ancient Rome", "a visitor from the twenty-first century",
     "I'm teaching a history lesson and want something fun to show my students."),
    ("a neighbour who is annoyed that my car is blocking his driveway", "the car's owner",
     "I want to practise handling awkward conversations politely."),
    ("a university admissions tutor", "an applicant for a history degree",
     "I have an admissions interview in December and want to practise thinking on my feet."),
    ("a reporter interviewing me about a local flood", "a resident whose street was flooded",
     "I'm on a media training course and need to practise answering questions on camera."),
    ("a wise old librarian in a fantasy city", "a young apprentice searching for a forbidden book",
     "I'm writing a fantasy novel and want to explore this scene through dialogue."),
    ("a car mechanic", "a driver whose car makes a strange rattling noise when braking",
     "I want to practise describing a problem and understanding the answer."),
)


# ---------------------------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------------------------

Draft = tuple[str, str]  # (group, text)


def _rng(name: str) -> random.Random:
    """A ``random.Random`` seeded from ``sha256(name)``: the same stream on every interpreter and machine."""
    return random.Random(int.from_bytes(hashlib.sha256(f"chat-requests:{name}".encode()).digest()[:8], "big"))


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _pairs(constraints: Sequence[str]) -> list[tuple[str, str]]:
    """Every two of ``constraints``, in their listed order (a request often states two)."""
    return [(a, b) for i, a in enumerate(constraints) for b in constraints[i + 1:]]


def _balanced(rng: random.Random, items: Sequence[tuple[str, Sequence[str]]], n: int) -> list[Draft]:
    """``n`` drafts: round-robin over ``items`` (group, variants), each item's variants in a seeded order.

    Every item is used ``n // len(items)`` or one more times, never with the same variant twice.
    """
    queues = [(group, rng.sample(list(variants), len(variants))) for group, variants in items]
    out: list[Draft] = []
    depth = 0
    while len(out) < n:
        if all(depth >= len(q) for _, q in queues):
            raise AssertionError(f"only {len(out)} variants exist, {n} wanted")  # a content bug, not input
        for group, q in queues:
            if depth < len(q) and len(out) < n:
                out.append((group, q[depth]))
        depth += 1
    return out


def _writing() -> list[Draft]:
    items = [(f"writing-{i:02d}", [_join(ctx, ask.format(what), *cs)
                                   for ask in _WRITING_ASKS for cs in _pairs(constraints)])
             for i, (ctx, what, constraints) in enumerate(WRITING)]
    return _balanced(_rng("writing"), items, PER_KIND)


def _open_question() -> list[Draft]:
    items = [(f"open-question-{i:02d}", [_join(ctx, q, *cs) for ctx in contexts for cs in _pairs(_OPEN_CONSTRAINTS)])
             for i, (q, contexts) in enumerate(OPEN_QUESTIONS)]
    return _balanced(_rng("open-question"), items, PER_KIND)


def _explanation() -> list[Draft]:
    items = [(f"explanation-{i:02d}", [_join(ctx, ask.format(concept=concept, audience=aud), c)
                                       for ask in _EXPLAIN_ASKS for aud in _AUDIENCE for c in _EXPLAIN_CONSTRAINTS])
             for i, (ctx, concept) in enumerate(EXPLANATIONS)]
    return _balanced(_rng("explanation"), items, PER_KIND)


def _advice() -> list[Draft]:
    items = [(f"advice-{i:02d}", [_join(lead, situation, question, c)
                                  for lead in _ADVICE_LEADS for c in _ADVICE_CONSTRAINTS])
             for i, (situation, question) in enumerate(ADVICE)]
    return _balanced(_rng("advice"), items, PER_KIND)


def _code() -> list[Draft]:
    functions = [(f"code-{i:02d}", [_join(ctx.format(lang=lang), f"Could you write a {lang} function that {task}?", *cs)
                                    for lang in _CODE_LANGUAGES for ctx in _CODE_CONTEXTS
                                    for cs in _pairs(_CODE_CONSTRAINTS)])
                 for i, task in enumerate(CODE_FUNCTIONS)]
    # A closer after a code block goes on its own paragraph.
    standalone = [(f"code-{len(CODE_FUNCTIONS) + i:02d}",
                   [text + ("\n\n" if "\n" in text else " ") + c for c in _CODE_CLOSERS])
                  for i, text in enumerate(CODE_REQUESTS)]
    return _balanced(_rng("code"), functions + standalone, PER_KIND)


def _passage_items(instructions: Sequence[str]) -> list[tuple[str, list[str]]]:
    return [(f"{PASSAGE_POOL}-{i:02d}", [layout.format(instruction=ins, passage=passage)
                                        for ins in instructions for layout in _LAYOUTS])
            for i, passage in enumerate(PASSAGES)]


def _summarise() -> list[Draft]:
    return _balanced(_rng("summarise"), _passage_items(SUMMARISE), PER_KIND)


def _extract() -> list[Draft]:
    return _balanced(_rng("extract"), _passage_items(EXTRACT), PER_KIND)


def _rewriting() -> list[Draft]:
    drafts = [(f"rewriting-{i:02d}", [_join(ctx, instruction_and_text) + "\n\n" + c
                                      for ctx in contexts for c in _REWRITE_CLOSERS])
              for i, (contexts, instruction_and_text) in enumerate(REWRITE_DRAFTS)]
    return _balanced(_rng("rewriting"), _passage_items(REWRITE_PASSAGE) + drafts, PER_KIND)


def _translation() -> list[Draft]:
    into = [(f"translation-{i:02d}", [_join(ctx.format(language=lang, country=country, city=city), c)
                                      + "\n\n" + text
                                      for lang, country, city in _LANGUAGES for c in _TRANSLATE_CONSTRAINTS])
            for i, (ctx, text) in enumerate(TRANSLATE_INTO)]
    from_ = [(f"translation-{len(TRANSLATE_INTO) + i:02d}",
              [_join(ctx, f"Could you translate it from {lang} into English?", c) + "\n\n" + text
               for ctx in contexts for c in _FROM_CONSTRAINTS])
             for i, (contexts, lang, text) in enumerate(TRANSLATE_FROM)]
    return _balanced(_rng("translation"), into + from_, PER_KIND)


def _roleplay() -> list[Draft]:
    items = [(f"roleplay-{i:02d}", [_join(lead, f"You are {role}, and I am {me}.", scene, rule)
                                    for lead in _ROLEPLAY_LEADS for rule in _ROLEPLAY_RULES])
             for i, (role, me, scene) in enumerate(ROLEPLAYS)]
    return _balanced(_rng("roleplay"), items, PER_KIND)


# Word problems: each template draws its numbers from the rng and returns the request text.
_NUMBER_WORDS = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}
_SHOW_WORK = ("Please show your working step by step.", "Could you explain each step so I can follow it?",
              "Please set out the calculation clearly so I can check it.")


def _steps(r: random.Random) -> str:
    """The closing request to show the working (the homework and the age puzzle ask for it in their own words)."""
    return " " + r.choice(_SHOW_WORK)


def _bake_sale(r: random.Random) -> str:
    trays, per, bag = r.randint(4, 9), r.choice((12, 15, 16, 18, 20, 24)), r.choice((3, 4, 5, 6))
    price = r.choice(("1.50", "2.00", "2.50", "3.00"))
    return (f"I'm organising a bake sale for my daughter's school. We baked {trays} trays of cookies with {per} "
            f"cookies on each tray, and we'll sell them in bags of {bag}. If each bag sells for {price} pounds, "
            "how much money will we raise if we sell every full bag, and how many cookies will be left over?"
            + _steps(r))


def _fuel(r: random.Random) -> str:
    use, price, dist = r.choice(("5.5", "6.2", "6.8", "7.4", "8.1")), r.choice(("1.65", "1.72", "1.79", "1.84")), \
        r.randrange(120, 480, 10)
    return (f"My car uses {use} litres of fuel per 100 kilometres, and fuel costs {price} euros per litre. We're "
            f"driving {dist} kilometres to visit my parents and then back home again. How much will the fuel for "
            "the whole round trip cost?" + _steps(r))


def _recipe(r: random.Random) -> str:
    serves, flour, milk, eggs = r.choice((4, 6)), r.randrange(200, 450, 25), r.randrange(250, 600, 50), r.choice((2, 3))
    guests = r.choice([g for g in range(3, 15) if g != serves])
    return (f"A pancake recipe for {serves} people needs {flour} grams of flour, {milk} millilitres of milk and "
            f"{eggs} eggs. I'm cooking brunch for {guests} people this weekend. How much of each ingredient should "
            "I use? Please round the eggs to a sensible whole number." + _steps(r))


def _discount(r: random.Random) -> str:
    price, off, voucher = r.randrange(60, 200, 5), r.choice((10, 15, 20, 25, 30, 40)), r.choice((5, 10, 15))
    return (f"A winter jacket costs {price} pounds. The shop is offering {off} per cent off, and I also have a "
            f"voucher for {voucher} pounds off the reduced price. How much will I pay in the end, and what "
            "percentage of the original price will I have saved in total?" + _steps(r))


def _savings(r: random.Random) -> str:
    target, have, weekly = r.randrange(900, 3000, 50), r.randrange(100, 600, 20), r.randrange(25, 120, 5)
    return (f"I'm saving for a summer holiday that will cost about {target:,} pounds. I already have {have} pounds "
            f"put aside, and I can save {weekly} pounds every week from my wages. How many weeks will it take me "
            "to reach my goal, and by how much will I have gone over it by then?" + _steps(r))


def _paint(r: random.Random) -> str:
    length, width, height = r.choice(("3.5", "4", "4.2", "4.5", "5")), r.choice(("3", "3.2", "3.6", "4")), \
        r.choice(("2.4", "2.5", "2.7"))
    openings, cover = r.choice(("3.5", "4", "4.8", "5.2")), r.choice((10, 11, 12))
    return (f"I'm painting a bedroom that is {length} metres long, {width} metres wide and {height} metres high. "
            f"I'll paint the four walls but not the ceiling, and the door and window together take up {openings} "
            f"square metres. One litre of paint covers {cover} square metres. How many litres do I need for two "
            "coats?" + _steps(r))


def _train(r: random.Random) -> str:
    hour, minute = r.randint(6, 16), r.choice((5, 10, 15, 20, 25, 35, 40, 45, 50))
    speed, dist = r.choice((80, 90, 100, 120, 140)), r.randrange(95, 420, 5)
    return (f"I'm planning a rail journey. My train leaves at {hour:02d}:{minute:02d} and covers {dist} kilometres "
            f"at an average speed of {speed} kilometres per hour. At what time will it arrive, to the nearest "
            "minute? I need to know whether I can make a meeting across town an hour after that." + _steps(r))


def _homework(r: random.Random) -> str:
    a, b = r.randint(23, 98), r.randint(14, 87)
    d = r.randint(6, 19)
    c = d * r.randint(12, 60)
    e, f, g = r.randint(300, 900), r.randint(150, 600), r.randint(100, 400)
    return (f"I'm checking my son's maths homework tonight and want to be sure of the answers before I mark "
            f"anything wrong. Could you work out {a} \u00d7 {b}, {c} \u00f7 {d} and {e} + {f} - {g}, and show the "
            "steps for each one so I can explain them to him?")


def _membership(r: random.Random) -> str:
    last = r.randrange(80, 400)
    now = last + r.choice((-1, 1)) * r.randint(8, last // 3)
    return (f"I'm the secretary of a local choir, and I'm writing the annual report. We had {last} members last "
            f"year and {now} this year. By what percentage did our membership change? If it changes by the same "
            "percentage next year, roughly how many members will we have?" + _steps(r))


def _bill(r: random.Random) -> str:
    people, total, tip = r.randint(3, 9), f"{r.randint(60, 320)}.{r.choice(('00', '40', '60', '80', '90'))}", \
        r.choice((10, 12, 12.5, 15))
    tip_text = f"{tip:g}"
    return (f"{_NUMBER_WORDS[people].capitalize()} of us went out for dinner to celebrate a friend's promotion, and "
            f"the bill came to {total} "
            f"dollars. We want to add a {tip_text} per cent tip and split the total equally. How much does each "
            "person pay, rounded to the nearest cent?" + _steps(r))


def _ages(r: random.Random) -> str:
    while True:  # whole ages: she is k times as old now, m times in `years` years, and at least 24 (an aunt)
        child, k, years = r.randint(3, 15), r.randint(3, 6), r.randint(2, 20)
        if k * child >= 24 and (k * child + years) % (child + years) == 0 \
                and 2 <= (k * child + years) // (child + years) < k:
            m = (k * child + years) // (child + years)
            break
    words = {2: "twice", 3: "three times", 4: "four times", 5: "five times", 6: "six times"}  # k <= 6
    return (f"My daughter brought home this puzzle and we're stuck. A woman is {words[k]} as old as her nephew. "
            f"In {years} years she will be {words[m]} as old as him. How old are they both now? Could you show "
            "how to set it up as equations?")


def _tank(r: random.Random) -> str:
    cap, fill = r.randrange(300, 1500, 50), r.choice((12, 15, 18, 20, 25))
    leak = r.choice([x for x in (2, 3, 4, 5, 6) if x < fill])
    return (f"We have a rainwater tank in the garden that holds {cap:,} litres. The hose fills it at {fill} litres "
            f"per minute, but there is a crack that leaks {leak} litres per minute while it fills. Starting from "
            "empty, how long will it take to fill the tank?" + _steps(r))


WORD_PROBLEMS: tuple[Callable[[random.Random], str], ...] = (
    _bake_sale, _fuel, _recipe, _discount, _savings, _paint, _train, _homework, _membership, _bill, _ages, _tank)


def _arithmetic() -> list[Draft]:
    rng = _rng("arithmetic")
    items = []
    for i, template in enumerate(WORD_PROBLEMS):
        variants: list[str] = []
        while len(variants) < 8:  # eight distinct draws per template
            text = template(rng)
            if text not in variants:
                variants.append(text)
        items.append((f"arithmetic-{i:02d}", variants))
    return _balanced(rng, items, PER_KIND)


_BUILDERS: dict[str, Callable[[], list[Draft]]] = {
    "writing": _writing, "open-question": _open_question, "explanation": _explanation, "advice": _advice,
    "arithmetic": _arithmetic, "code": _code, "summarise": _summarise, "extract": _extract,
    "translation": _translation, "rewriting": _rewriting, "roleplay": _roleplay,
}


def _pool(group: str) -> str:
    """The split pool of a group: ``"passage"`` for the shared passages, else the kind's own items."""
    return group.rsplit("-", 1)[0]


def group_splits(groups: set[str]) -> dict[str, str]:
    """The split of every group: per pool, ranked by ``sha256(f"split:{group}")``, first half (rounded up) held out."""
    pools: dict[str, list[str]] = {}
    for g in groups:
        pools.setdefault(_pool(g), []).append(g)
    split: dict[str, str] = {}
    for members in pools.values():
        ranked = sorted(members, key=lambda g: hashlib.sha256(f"split:{g}".encode()).hexdigest())
        n_held = (len(ranked) + 1) // 2
        split.update({g: "heldout" if i < n_held else "train" for i, g in enumerate(ranked)})
    return split


def chat_requests() -> list[ChatRequest]:
    """Every request, in a fixed order (kind by kind, :data:`KINDS`), ids ``chat-NNNN-<kind>`` from 1.

    Deterministic: the same list on every call, interpreter and machine. Texts are unique.
    """
    drafts = [(kind, group, text) for kind in KINDS for group, text in _BUILDERS[kind]()]
    seen: set[str] = set()
    for kind, _, text in drafts:
        if text in seen:
            raise AssertionError(f"duplicate {kind} request: {text[:60]!r}")  # a content bug
        seen.add(text)
    split = group_splits({g for _, g, _ in drafts})
    return [ChatRequest(f"chat-{i:04d}-{kind}", kind, text, split[group], group)
            for i, (kind, group, text) in enumerate(drafts, 1)]


def sample_key(seed: int, request_id: str) -> str:
    """A request's rank in the seeded random order, ``sha256(f"{seed}:{request_id}")``.

    The same rule as the UltraChat presets' ``companion.harvest.presets.sample_key`` (not imported:
    the presets will import this module).
    """
    return hashlib.sha256(f"{seed}:{request_id}".encode()).hexdigest()


def default_subset(requests: Sequence[ChatRequest], n: int, seed: int = 0) -> list[ChatRequest]:
    """A fixed, seeded sample of ``n`` held-out requests, spread across the kinds.

    Each kind's held-out requests are ranked by :func:`sample_key`; the kinds are ordered by
    their best-ranked request; then round-robin over the kinds, each turn taking that kind's
    best-ranked request whose group (passage, topic, template) is not yet in the sample, or its
    best-ranked one if every group is. So the first ``len(kinds)`` requests cover every kind,
    and small samples repeat no passage or topic while they can avoid it.
    """
    held = [r for r in requests if r.split == "heldout"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(held):
        raise ValueError(f"n must be an integer from 1 to {len(held)} (the held-out requests given), got {n!r}")
    queues: dict[str, list[ChatRequest]] = {}
    for r in sorted(held, key=lambda r: sample_key(seed, r.request_id)):
        queues.setdefault(r.kind, []).append(r)
    order = sorted(queues, key=lambda k: sample_key(seed, queues[k][0].request_id))
    chosen: list[ChatRequest] = []
    used: set[str] = set()
    while len(chosen) < n:
        for kind in order:
            queue = queues[kind]
            if not queue or len(chosen) == n:
                continue
            pick = next((r for r in queue if r.group not in used), queue[0])
            queue.remove(pick)
            chosen.append(pick)
            used.add(pick.group)
    return chosen


# ---------------------------------------------------------------------------------------------
# Templating and the committed asset
# ---------------------------------------------------------------------------------------------

def templated(tokenizer: Any, text: str) -> str:
    """``text`` as one user turn in the tokenizer's chat template, with the generation prompt.

    The same call as the UltraChat presets' ``chat_prompt`` (SmolLM2's template adds its default
    system turn; models without thinking ignore ``enable_thinking``).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("tokenizer must have a chat template (a chat model's tokenizer), got one without")
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False)


def build_prompt_set(tokenizer: Any, requests: Sequence[ChatRequest]) -> list[Prompt]:
    """The prompts of ``requests`` in order: templated text, its token count, ``source`` = kind and split.

    ``n_tokens = len(tokenizer(text, add_special_tokens=False).input_ids)`` (the template already
    holds the special tokens). Raises ``ValueError`` naming the first request under
    :data:`MIN_TOKENS` tokens; nothing is returned then.
    """
    prompts: list[Prompt] = []
    for i, r in enumerate(requests):
        text = templated(tokenizer, r.text)
        n_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if n_tokens < MIN_TOKENS:
            raise ValueError(f"request {r.request_id} has {n_tokens} tokens once chat-templated; every request "
                             f"must have at least {MIN_TOKENS}")
        prompts.append(Prompt(r.request_id, text, n_tokens, f"{SOURCE_PREFIX}:{r.kind}:{r.split}", i))
    return prompts


def asset_order(requests: Sequence[ChatRequest], seed: int = 0) -> list[ChatRequest]:
    """The committed file's order: every held-out request in :func:`default_subset` order, then the
    training split in the set's order. So the first ``n`` prompts of the file are the default
    build's seeded held-out sample of ``n``, whatever ``n`` up to the held-out count, and a larger
    run (the full profile's 500) adds the training split's requests only past the held-out ones."""
    held = sum(r.split == "heldout" for r in requests)
    return default_subset(requests, held, seed) + [r for r in requests if r.split == "train"]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m companion.chat_requests --tokenizer DIR [--out FILE]``: write the canonical prompt file."""
    parser = argparse.ArgumentParser(prog="python -m companion.chat_requests",
                                     description="Template every chat request with a tokenizer and write the "
                                                 "canonical prompt JSONL (both splits).")
    parser.add_argument("--tokenizer", required=True, type=Path, help="folder of a saved chat tokenizer")
    parser.add_argument("--out", type=Path, default=ASSET_FILE, help=f"output file (default: {ASSET_FILE})")
    args = parser.parse_args(argv)

    def fail(message: str) -> int:
        print(f"error: {message}", file=sys.stderr)
        return 2

    if not args.tokenizer.is_dir():
        return fail(f"--tokenizer must be a folder holding a saved tokenizer, got {str(args.tokenizer)!r} "
                    "(not a folder)")
    if not args.out.parent.is_dir():
        return fail(f"--out must be a file in an existing folder, got {str(args.out)!r} (no folder "
                    f"{str(args.out.parent)!r})")
    from transformers import AutoTokenizer  # heavy; only the command needs it

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        first = first if len(first) <= 160 else first[:157] + "..."  # transformers lists every model type
        return fail(f"--tokenizer must be a folder holding a saved tokenizer, got {str(args.tokenizer)!r} ({first})")
    try:
        prompts = build_prompt_set(tokenizer, asset_order(chat_requests()))
    except ValueError as err:
        return fail(str(err))
    atomic.write_text(args.out, dumps_prompts(prompts))
    lengths = [p.n_tokens for p in prompts]
    held = sum(p.source.endswith(":heldout") for p in prompts)
    print(f"wrote {args.out}: {len(prompts)} prompts ({held} held out), templated tokens min {min(lengths)}, "
          f"median {statistics.median(lengths):g}, max {max(lengths)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
