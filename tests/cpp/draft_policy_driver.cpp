// Replays recorded policy inputs through common/draft-policy.h (the llama-server twin of
// gguf_exact/engines/shared/draft_policy.py) and prints the k of every "choose" line.
// Input lines: "settings N_MAX PRIOR PRIOR_WEIGHT DECAY COST_WEIGHT PROBE PROBE_MAX COST_MAX_AGE SWITCH_MARGIN COST_WINDOW
// RETIME_MARGIN BURST_RATIO OUTLIER_RATIO RECHECK_INTERVAL [EXPLORE_WEIGHT EXPLORE_ERRORS [SHADOW]]" first (the bracketed
// ones: the header's defaults when absent, as in traces llama-server writes), then
// "choose LIMIT [OTHERS_ROWS OTHERS_TOKENS OTHERS_DRAFTS[:OTHERS_DRAFTED] [AFTER [LAYOUT...]]]", "pass ROWS SECONDS [TOTAL_ROWS [PASSES]]", "steps N SECONDS [SEQUENCE_STEPS]", "seed ROWS SECONDS", "step-seed STEPS SECONDS [SEQUENCES]", "batch-seed TOTAL SECONDS", "result DRAFTED ACCEPTED [CHANCE...]", "shadow DRAFTED ACCEPTED [CHANCE...]", "class NAME"
// (the acceptance class of the requests from there on: greedy, sampled-exact, sampled-rejection); a line starting
// with "#" is a comment (llama-server's LLAMA_SPEC_DRAFT_TRACE writes this format, with comments). The bracketed
// fields (the batch other slots share, issue 39; a cache per slot's layout and graph passes; the drafter's
// sequences) are 0 (empty, 1) when absent, as in traces written before them.
#include "draft-policy.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

int main() {
    common_draft_policy_settings s;
    std::string what;
    std::cin >> what;
    if (what != "settings") {
        std::fprintf(stderr, "expected a settings line first\n");
        return 2;
    }
    std::string prior, weight, decay, cost_weight, switch_margin, retime_margin, burst_ratio, outlier_ratio;
    std::cin >> s.n_max >> prior >> weight >> decay >> cost_weight >> s.probe_interval >> s.probe_interval_max >> s.cost_max_age >> switch_margin
             >> s.cost_window >> retime_margin >> burst_ratio >> outlier_ratio >> s.recheck_interval;
    s.prior        = std::strtod(prior.c_str(), nullptr);
    s.prior_weight = std::strtod(weight.c_str(), nullptr);
    s.decay        = std::strtod(decay.c_str(), nullptr);
    s.cost_weight  = std::strtod(cost_weight.c_str(), nullptr);
    s.switch_margin = std::strtod(switch_margin.c_str(), nullptr);
    s.retime_margin = std::strtod(retime_margin.c_str(), nullptr);
    s.burst_ratio   = std::strtod(burst_ratio.c_str(), nullptr);
    s.outlier_ratio = std::strtod(outlier_ratio.c_str(), nullptr);
    std::string rest, explore_weight, explore_errors;
    std::getline(std::cin, rest);
    std::istringstream more(rest);
    if (more >> explore_weight >> explore_errors) {
        s.explore_weight = std::strtod(explore_weight.c_str(), nullptr);
        s.explore_errors = std::strtod(explore_errors.c_str(), nullptr);
        int shadow = 0;
        s.shadow = (more >> shadow) && shadow != 0;
    }
    common_draft_policy policy(s);
    while (std::cin >> what) {
        if (what[0] == '#') { // a comment: what llama-server's LLAMA_SPEC_DRAFT_TRACE notes beside the inputs
            std::getline(std::cin, what);
        } else if (what == "choose") {
            int limit;
            std::cin >> limit;
            std::string rest, tokens = "0";
            std::getline(std::cin, rest);
            std::istringstream more(rest);
            int others = 0, drafts = 0, drafted = 0, after = 0;
            more >> others >> tokens >> drafts;
            if (more.peek() == ':') {
                more.get();
                more >> drafted;
            }
            more >> after;
            std::vector<int32_t> layout;
            for (int32_t r; more >> r;) {
                layout.push_back(r);
            }
            std::printf("%d\n", policy.choose(limit, others, std::strtod(tokens.c_str(), nullptr), drafts, after, layout, drafted));
        } else if (what == "pass" || what == "steps" || what == "seed" || what == "step-seed" || what == "batch-seed") {
            int n;
            std::string seconds, rest;
            std::cin >> n >> seconds;
            std::getline(std::cin, rest);
            std::istringstream more(rest);
            int count = 0, passes = 1; // a pass's total rows, a call's sequence-steps, a step-seed's sequences
            more >> count >> passes;
            const double t = std::strtod(seconds.c_str(), nullptr);
            if (what == "pass") {
                policy.observe_pass(n, t, count, passes);
            } else if (what == "seed") {
                policy.seed(n, t);
            } else if (what == "step-seed") {
                policy.seed_steps(n, t, count > 0 ? count : 1);
            } else if (what == "batch-seed") {
                policy.seed_batch(n, t);
            } else {
                policy.observe_steps(n, t, count);
            }
        } else if (what == "class") {
            std::string name;
            std::cin >> name;
            const auto * end = common_draft_class_names + COMMON_DRAFT_CLASS_COUNT;
            const auto * at  = std::find_if(common_draft_class_names, end, [&](const char * n) { return name == n; });
            if (at == end) {
                std::fprintf(stderr, "unknown acceptance class %s\n", name.c_str());
                return 2;
            }
            policy.set_class((common_draft_class) (at - common_draft_class_names));
        } else if (what == "result" || what == "shadow") { // each draft's chance of being kept where written
            int drafted, accepted;
            std::string rest, chance;
            std::cin >> drafted >> accepted;
            std::getline(std::cin, rest);
            std::istringstream more(rest);
            std::vector<double> chances;
            while (more >> chance) {
                chances.push_back(std::strtod(chance.c_str(), nullptr));
            }
            if (what == "result") {
                policy.observe_result(drafted, accepted, chances);
            } else {
                policy.observe_shadow(drafted, accepted, chances);
            }
        } else {
            std::fprintf(stderr, "unknown event %s\n", what.c_str());
            return 2;
        }
    }
    return 0;
}
