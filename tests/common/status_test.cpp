// Status / Result basics.
#include <gtest/gtest.h>

#include "common/status.h"

namespace tandem {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value {} is not positive", v);
  return v;
}

Status use_it(int v, int* out) {
  TANDEM_ASSIGN_OR_RETURN(int x, parse_positive(v));
  *out = x * 2;
  return Status();
}

TEST(Status, ResultCarriesValueOrError) {
  EXPECT_TRUE(parse_positive(3).ok());
  EXPECT_EQ(parse_positive(3).value(), 3);
  auto r = parse_positive(-1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().to_string(), "invalid_argument: value -1 is not positive");
}

TEST(Status, AssignOrReturnPropagates) {
  int out = 0;
  EXPECT_TRUE(use_it(4, &out).ok());
  EXPECT_EQ(out, 8);
  Status s = use_it(0, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.with_context("flag --x").message(), "flag --x: value 0 is not positive");
}

}  // namespace
}  // namespace tandem
