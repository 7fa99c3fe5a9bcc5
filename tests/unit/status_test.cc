#include "common/base/status.h"

#include <gtest/gtest.h>

#include "common/rpc/grpc_status.h"

namespace dflash {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::Status Quarter(int x, int* out) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(*out, Half(h));
  return absl::OkStatus();
}

absl::Status Check(bool ok) {
  RETURN_IF_ERROR(ok ? absl::OkStatus() : absl::NotFoundError("missing"));
  return absl::InternalError("reached the end");
}

TEST(StatusMacros, AssignOrReturnPropagatesErrorsAndValues) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  absl::Status s = Quarter(6, &out);  // 6 -> 3 -> odd
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd");
}

TEST(StatusMacros, ReturnIfErrorStopsEarly) {
  EXPECT_EQ(Check(false).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Check(true).code(), absl::StatusCode::kInternal);
}

TEST(StatusMacros, AnnotateKeepsCodeAndPrefixesContext) {
  absl::Status s = Annotate(absl::NotFoundError("no such run"), "status r-1");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "status r-1: no such run");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "x").ok());
}

TEST(GrpcStatus, EveryCanonicalCodeRoundTrips) {
  for (int c = 1; c <= 16; ++c) {
    absl::Status s(static_cast<absl::StatusCode>(c), "msg");
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(g.error_message(), "msg");
    absl::Status back = FromGrpcStatus(g);
    EXPECT_EQ(back.code(), s.code());
    EXPECT_EQ(back.message(), "msg");
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatus, SpecificMappingsUsedByClients) {
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("x")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::UnimplementedError("x")).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("x")).error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace dflash
